package apiserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
)

// RunOptions start a kube-apiserver.
type RunOptions struct {
	// Binary is kube-apiserver (Build's).
	Binary string
	// Etcd are the etcd members' client URLs (--etcd-servers).
	Etcd []string
	// Policy is OPROUTE_ETCD_POLICY, which the patched storage factory
	// reads: empty for etcd's stock client, else a router policy.
	Policy string
	// Args are more flags, after Start's own (a later flag wins).
	Args []string
	// Output receives the server's standard output and error; nil
	// discards them.
	Output io.Writer
	// Timeout bounds the wait for /readyz. Default: a minute.
	Timeout time.Duration
}

// ErrNotReady: kube-apiserver did not answer /readyz ok in time, or ended
// first (the error says which, with the last answer).
var ErrNotReady = errors.New("apiserver: kube-apiserver not ready")

// errPortTaken: another process bound the port chosen for the server
// between the choice and the server's bind.
var errPortTaken = errors.New("apiserver: port taken")

// Server is a running kube-apiserver on loopback.
type Server struct {
	// URL is where it serves (https, a certificate of its own making).
	URL string
	// Token is a bearer token of a member of system:masters.
	Token string

	cmd  *exec.Cmd
	done chan struct{}
	dir  string
}

// Start runs kube-apiserver as the paper ran it (the watch cache off)
// against the etcd members o.Etcd, with what a standalone server needs and
// nothing else: a self-signed serving certificate it makes itself, a
// service-account key, a static token for a member of system:masters,
// every request allowed, and no ServiceAccount admission (no
// controller-manager creates the accounts). It returns once /readyz
// answers ok, which includes the server's own etcd check through its
// client.
func Start(ctx context.Context, o RunOptions) (*Server, error) {
	if o.Binary == "" || len(o.Etcd) == 0 {
		return nil, errors.New("apiserver: Start needs the binary and etcd's endpoints")
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	sweepDirs()
	// The port is chosen before the server binds it: another process may
	// take it meanwhile, and then a new one is chosen.
	for attempt := 1; ; attempt++ {
		s, err := start(ctx, o)
		if errors.Is(err, errPortTaken) && attempt < 3 {
			continue
		}
		return s, err
	}
}

// dirPrefix names Start's directories in the temporary directory, with the
// process's ID after it.
const dirPrefix = "oproute-kube-apiserver-"

// sweepDirs removes the directories of Starts in processes that are gone
// (killed before their Close): they hold a private key and a token.
func sweepDirs() {
	matches, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, m := range matches {
		pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(m), dirPrefix), "-")
		n, err := strconv.Atoi(pid)
		if err != nil || n == os.Getpid() {
			continue
		}
		if syscall.Kill(n, 0) == syscall.ESRCH {
			os.RemoveAll(m)
		}
	}
}

func start(ctx context.Context, o RunOptions) (_ *Server, err error) {
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", dirPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	s := &Server{Token: hex.EncodeToString(token), dir: dir, done: make(chan struct{})}
	files := map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(s.Token + `,oproute-admin,oproute-admin,"system:masters"` + "\n"),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			return nil, fmt.Errorf("apiserver: %w", err)
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	args := []string{
		"--etcd-servers=" + strings.Join(o.Etcd, ","),
		"--watch-cache=false",
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The lease reconciler refuses a loopback address as the
		// kubernetes Service's endpoint; Kubernetes' own test server
		// turns it off too.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=AlwaysAllow",
		"--disable-admission-plugins=ServiceAccount",
		"--service-cluster-ip-range=10.0.0.0/24",
	}
	cmd := exec.Command(o.Binary, append(args, o.Args...)...)
	cmd.Env = append(os.Environ(), "OPROUTE_ETCD_POLICY="+o.Policy)
	// The output goes to o.Output and is watched for a port taken.
	taken := &portWatch{}
	var out io.Writer = taken
	if o.Output != nil {
		out = io.MultiWriter(o.Output, taken)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	s.cmd = cmd
	go func() { cmd.Wait(); close(s.done) }()
	if err := s.awaitReady(ctx, o.Timeout); err != nil {
		s.Close()
		if taken.seen.Load() {
			return nil, fmt.Errorf("%w: %d (%w)", errPortTaken, port, err)
		}
		return nil, err
	}
	return s, nil
}

// portWatch notes whether kube-apiserver's output says its port was taken.
type portWatch struct{ seen atomic.Bool }

func (w *portWatch) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("address already in use")) {
		w.seen.Store(true)
	}
	return len(p), nil
}

// awaitReady polls /readyz until it answers ok, the process ends, or the
// timeout.
func (s *Server) awaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := s.httpClient()
	defer client.CloseIdleConnections()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.Token)
		if resp, err := client.Do(req); err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-s.done:
			return fmt.Errorf("%w: it ended first (%v); last /readyz: %s", ErrNotReady, s.cmd.ProcessState, last)
		case <-ctx.Done():
			return fmt.Errorf("%w within %v (%w); last /readyz: %s", ErrNotReady, timeout, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// httpClient trusts the server's self-made certificate: on loopback, for
// the test bed only.
func (s *Server) httpClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

// PID is the server's process ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Metrics is the server's /metrics (Prometheus' text format), read as its
// admin.
func (s *Server) Metrics(ctx context.Context) ([]byte, error) {
	client := s.httpClient()
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("apiserver: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("apiserver: /metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("apiserver: /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("apiserver: /metrics: %s", resp.Status)
	}
	return body, nil
}

// RESTConfig is client-go's configuration for the server, as its admin.
func (s *Server) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     s.Token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
	}
}

// Close ends the server (SIGTERM, SIGKILL after 10 s) and removes its
// files.
func (s *Server) Close() error {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			<-s.done
		}
	}
	return os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("apiserver: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
