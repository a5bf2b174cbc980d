package zk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oproute/oproute/router"
)

// EnsembleConfigPath is the node that holds the ensemble's configuration
// (ZooKeeper 3.5+, the node getConfig reads; its data changes with every
// reconfig).
const EnsembleConfigPath = "/zookeeper/config"

// ErrNoClientAddress: the ensemble's configuration names no client
// address for a server (its line has no ";[host:]port" part, as servers
// configured with a static clientPort write it), so the servers cannot be
// learnt from it: keep them up to date with SetServers.
var ErrNoClientAddress = errors.New("oproute/zk: the ensemble's configuration names no client address")

// Events of WithEnsembleTracking.
const (
	// EventServersChanged: a server list learnt from the ensemble's
	// configuration (attrs: servers, version).
	EventServersChanged = "zk_servers_changed"
	// EventServersNotFollowed (warn): the configuration could not be read
	// or used (attr: error); logged once per distinct error.
	EventServersNotFollowed = "zk_servers_not_followed"
)

// ClientAddrs returns the client addresses (host:port) of the servers in a
// ZooKeeper dynamic configuration, the data of EnsembleConfigPath:
// "server.<id>=<host>:<quorum>:<election>[:<role>][;[<client host>:]<client port>]"
// lines and a "version=" line. Observers are included: they serve reads. A
// wildcard client host (0.0.0.0, ::, or none) is the server's own host.
func ClientAddrs(config []byte) (addrs []string, version string, err error) {
	for line := range strings.Lines(string(config)) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "version="); ok {
			version = v
			continue
		}
		if !strings.HasPrefix(line, "server.") {
			continue
		}
		id, spec, ok := strings.Cut(line, "=")
		if !ok {
			return nil, "", fmt.Errorf("oproute/zk: bad configuration line %q", line)
		}
		peer, client, ok := strings.Cut(spec, ";")
		if !ok || client == "" {
			return nil, "", fmt.Errorf("%w: %s", ErrNoClientAddress, id)
		}
		host, port, err := net.SplitHostPort(client)
		if err != nil { // a port alone
			host, port = "", client
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, "", fmt.Errorf("oproute/zk: configuration line %q: bad client port %q", line, port)
		}
		if wildcard(host) {
			if host, err = peerHost(peer); err != nil {
				return nil, "", fmt.Errorf("oproute/zk: configuration line %q: %w", line, err)
			}
			if wildcard(host) {
				// A server's own line may name 0.0.0.0 (it binds all
				// addresses): nobody can dial that.
				return nil, "", fmt.Errorf("%w: %s names no address a client can dial", ErrNoClientAddress, id)
			}
		}
		addrs = append(addrs, net.JoinHostPort(host, port))
	}
	if len(addrs) == 0 {
		return nil, "", fmt.Errorf("%w: no server lines", ErrNoClientAddress)
	}
	return addrs, version, nil
}

func wildcard(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::" || host == "0:0:0:0:0:0:0:0"
}

// peerHost returns the host of a server line's peer part
// ("host:quorum:election[:role]", the host possibly "[v6]").
func peerHost(peer string) (string, error) {
	if rest, ok := strings.CutPrefix(peer, "["); ok {
		if h, _, ok := strings.Cut(rest, "]"); ok {
			return h, nil
		}
		return "", errors.New("unclosed [")
	}
	h, _, ok := strings.Cut(peer, ":")
	if !ok || h == "" {
		return "", errors.New("no host")
	}
	return h, nil
}

// SyncServers reads the ensemble's configuration (a linearizable read of
// EnsembleConfigPath) and makes its servers the Conn's, as SetServers
// does: clientv3's Sync for ZooKeeper. Addresses are taken as the
// configuration writes them: a server given to Connect under another
// spelling (a host name for its IP) is replaced by the configuration's,
// and starts afresh. It fails with ErrNoClientAddress when the
// configuration names no client ports.
func (c *Conn) SyncServers(ctx context.Context) error {
	data, _, err := c.GetContext(linearizable(ctx), EnsembleConfigPath)
	if err != nil {
		return fmt.Errorf("oproute/zk: reading %s: %w", EnsembleConfigPath, err)
	}
	_, err = c.applyEnsembleConfig(data)
	return err
}

// applyEnsembleConfig makes the servers of a configuration the Conn's,
// unless they already are; it reports whether they changed.
func (c *Conn) applyEnsembleConfig(data []byte) (bool, error) {
	addrs, version, err := ClientAddrs(data)
	if err != nil {
		return false, err
	}
	// The configuration's version is the zxid that committed it (hex):
	// a read that raced a newer one (SyncServers and the tracker) must
	// not undo it.
	c.cfgMu.Lock()
	defer c.cfgMu.Unlock()
	if v, err := strconv.ParseUint(version, 16, 64); err == nil {
		if v < c.cfgVersion {
			return false, nil
		}
		c.cfgVersion = v
	}
	var live []string
	srv := c.servers()
	for i, a := range srv.addrs {
		if !srv.retired[i] {
			live = append(live, a)
		}
	}
	if slices.Equal(slices.Sorted(slices.Values(live)), slices.Sorted(slices.Values(addrs))) {
		return false, nil
	}
	if err := c.SetServers(addrs); err != nil {
		return false, err
	}
	c.onEvent(router.Event{Kind: EventServersChanged, Attrs: []slog.Attr{
		slog.Any("servers", addrs), slog.String("version", version)}})
	return true, nil
}

// WithEnsembleTracking makes the Conn follow the ensemble's own
// configuration, as Curator's EnsembleTracker does: it watches
// EnsembleConfigPath and, after each reconfig, makes the servers named
// there the Conn's (SyncServers). The servers must be configured with
// their client address in their server lines (ZooKeeper 3.5+ dynamic
// configuration, "server.1=host:2888:3888;2181").
func WithEnsembleTracking() Option { return func(o *options) { o.trackEnsemble = true } }

// trackEnsemble follows the ensemble's configuration until Close: a watch
// on EnsembleConfigPath, set again after each change. A configuration it
// cannot use is logged and kept watched; a read that failed is tried again
// after a backoff (a second, doubling up to 30 s, each wait jittered
// ±20 %).
func (c *Conn) trackEnsemble() {
	const maxBackoff = 30 * time.Second
	backoff, lastErr := time.Second, ""
	for c.ctx.Err() == nil {
		data, _, ch, err := c.GetWContext(linearizable(c.ctx), EnsembleConfigPath)
		if err == nil {
			backoff = time.Second
			_, err = c.applyEnsembleConfig(data)
		}
		switch {
		case err == nil:
			lastErr = ""
		case c.ctx.Err() == nil && !errors.Is(err, ErrClosed) && err.Error() != lastErr:
			lastErr = err.Error()
			c.onEvent(router.Event{Kind: EventServersNotFollowed, Warn: true, Attrs: []slog.Attr{slog.String("error", lastErr)}})
		}
		if ch == nil {
			select {
			case <-c.ctx.Done():
			case <-time.After(jitter(backoff)):
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		select {
		case <-ch:
		case <-c.ctx.Done():
		}
	}
}
