package bench

import (
	"runtime"
	"runtime/debug"
	"time"
)

// Meta describes the run that wrote a results.json: how it was started,
// on what and by which build, so that the file says what its records
// measured without the terminal it ran in.
type Meta struct {
	// Command is the command line, arguments as given but secrets
	// (routebench's --password) replaced.
	Command []string `json:"command"`
	// Started is when the run started, UTC, RFC 3339.
	Started string `json:"started"`
	// Backend is the backend asked for (--backend); scenarios bound to
	// the other store name theirs in their records.
	Backend string `json:"backend"`
	// Workload is the base workload, every field, before the scenarios'
	// variants (each record holds its own).
	Workload *Workload `json:"workload,omitempty"`
	// Endpoints are the external cluster's, nil on the test bed.
	Endpoints []string `json:"endpoints,omitempty"`
	// KeyPrefix is where the workload's keys were written; KeysKept says
	// they were left there (else they were deleted after the run).
	KeyPrefix string `json:"key_prefix,omitempty"`
	KeysKept  bool   `json:"keys_kept,omitempty"`
	// CPUModes are the CPU modes the run's clusters ran in, in order
	// (RunCPUMode: CPUModeBudgets, CPUModeShared, CPUModeExternal,
	// CPUModeSimulated): one, or the dominance grid's several.
	CPUModes []string `json:"cpu_modes,omitempty"`
	// ServerVersions are the servers' versions by backend ("etcd", "zk"),
	// one per member in endpoint order, "" where a member did not say:
	// etcd's Status version, ZooKeeper's srvr "Zookeeper version" line.
	ServerVersions map[string][]string `json:"server_versions,omitempty"`
	// Client is the process that ran the clients.
	Client ClientInfo `json:"client"`
}

// ClientInfo is the build and host of the process that ran the clients.
type ClientInfo struct {
	GoVersion string `json:"go_version"`
	GOOS      string `json:"goos"`
	GOARCH    string `json:"goarch"`
	NumCPU    int    `json:"num_cpu"`
	// Module is oproute's module path and Version its version as the
	// build says ("(devel)" or a pseudo-version when built from a
	// checkout); "" when the binary carries no build information.
	Module  string `json:"module,omitempty"`
	Version string `json:"module_version,omitempty"`
	// Revision and Modified are the checkout's commit and whether it had
	// uncommitted changes, as go build stamps them (vcs.revision,
	// vcs.modified); absent when it did not (go run and go test do not,
	// nor -buildvcs=false).
	Revision string `json:"vcs_revision,omitempty"`
	Modified *bool  `json:"vcs_modified,omitempty"`
}

// CPUModeExternal is the CPU mode of a cluster routebench attached to
// (--endpoints): neither its members' CPU nor their sharing is known.
const CPUModeExternal = "external"

// RunCPUMode is the short name of the CPU mode a runner with opts runs in:
// CPUModeExternal with Endpoints, else CPUModeName of its CPUMode.
func RunCPUMode(opts Options) string {
	if len(opts.Endpoints) > 0 {
		return CPUModeExternal
	}
	return CPUModeName(CPUMode(opts.Backend, opts.Nodes, opts.ClientCPU))
}

// NewMeta is a run's Meta as far as the caller knows it at the start:
// the command line, the backend and base workload, and this process's
// build and host. The caller adds the rest (endpoints, key prefix, CPU
// modes, and the servers' versions as Options.ServerVersions tells them).
func NewMeta(command []string, backend string, w Workload, started time.Time) *Meta {
	return &Meta{Command: command, Started: started.UTC().Format(time.RFC3339), Backend: backend, Workload: &w, Client: clientInfo()}
}

// oprouteModule is this module's path, found among a build's
// dependencies when the main module is another (storagebench's).
const oprouteModule = "github.com/oproute/oproute"

func clientInfo() ClientInfo {
	c := ClientInfo{GoVersion: runtime.Version(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return c
	}
	mod := &info.Main
	for _, d := range info.Deps {
		if mod.Path != oprouteModule && d.Path == oprouteModule {
			mod = d
		}
	}
	if mod.Path == oprouteModule {
		c.Module, c.Version = mod.Path, mod.Version
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			c.Revision = s.Value
		case "vcs.modified":
			modified := s.Value == "true"
			c.Modified = &modified
		}
	}
	return c
}
