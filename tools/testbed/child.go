package testbed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/oproute/oproute/tools/testbed/proxy"
)

// memberEnv carries a memberSpec to a re-executed member process.
const memberEnv = "OPROUTE_TESTBED_ETCD_MEMBER"

// Lines a member process prints on stdout.
const (
	readyLine = "oproute-testbed-member-ready"
	ackLine   = "ok"
)

type memberSpec struct {
	Index           int       `json:"index"`
	Name            string    `json:"name"`
	Dir             string    `json:"dir"`
	ListenClient    string    `json:"listen_client"`
	AdvertiseClient string    `json:"advertise_client"`
	ListenPeer      string    `json:"listen_peer"`
	AdvertisePeer   string    `json:"advertise_peer"`
	InitialCluster  string    `json:"initial_cluster"`
	ClusterState    string    `json:"cluster_state"`
	Token           string    `json:"token"`
	CertFile        string    `json:"cert_file,omitempty"`
	KeyFile         string    `json:"key_file,omitempty"`
	ProxiesApart    bool      `json:"proxies_apart,omitempty"`
	Net             *netState `json:"net"`
}

// control is one line the parent sends a member on stdin.
type control struct {
	// Net replaces the network state; the member answers ackLine.
	Net *netState `json:"net,omitempty"`
	// Query "accepted" asks how many client connections the member's
	// client proxy has accepted; the member answers "accepted N". Query
	// "traffic" asks what its proxies have forwarded; it answers "traffic"
	// and a linkTraffic in JSON.
	Query string `json:"query,omitempty"`
}

func init() {
	// A re-executed member never returns to the host program's main.
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
}

func hostOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	return u.Host
}

// etcdProxiesEnv carries a memberSpec to a re-executed process that hosts
// the member's proxies apart from it (CPUBudgets.ProxiesApart).
const etcdProxiesEnv = "OPROUTE_TESTBED_ETCD_PROXIES"

func init() {
	if spec := os.Getenv(etcdProxiesEnv); spec != "" {
		os.Exit(runEtcdProxies(spec))
	}
}

// etcdProxies are an etcd member's proxies: one on its advertised client
// port, one on its advertised peer port that tells senders apart by the
// header etcd's peers send.
type etcdProxies struct {
	client, peer *proxy.Proxy
}

// listenEtcdProxies starts member spec's proxies, shaped by net.
func listenEtcdProxies(spec memberSpec, net *atomic.Pointer[netState]) (*etcdProxies, error) {
	client, err := proxy.Listen(portOf(spec.AdvertiseClient), proxy.Config{
		Target: hostOf(spec.ListenClient),
		Shape:  func(string, proxy.Direction) proxy.Link { return net.Load().clientLink(spec.Index) },
	})
	if err != nil {
		return nil, fmt.Errorf("client proxy: %w", err)
	}
	peer, err := proxy.Listen(portOf(spec.AdvertisePeer), proxy.Config{
		Target:   hostOf(spec.ListenPeer),
		Identify: proxy.HeaderKey("X-Server-From"),
		Shape:    func(key string, _ proxy.Direction) proxy.Link { return net.Load().peerLink(spec.Index, key) },
	})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("peer proxy: %w", err)
	}
	return &etcdProxies{client: client, peer: peer}, nil
}

func (p *etcdProxies) close() {
	p.client.Close()
	p.peer.Close()
}

// serve answers the parent's control lines (serveControl) from the start,
// so that a network change made while etcd starts reaches the proxies at
// once.
func (p *etcdProxies) serve(net *atomic.Pointer[netState]) <-chan struct{} {
	traffic := func() linkTraffic {
		l := linkTraffic{Client: p.client.Forwarded()[""]}
		ids := net.Load().IDs
		for key, n := range p.peer.Forwarded() {
			from, ok := ids[key]
			if !ok {
				from = unknownSender
			}
			l.addPeer(from, n)
		}
		return l
	}
	return serveControl(net, []*proxy.Proxy{p.client, p.peer}, p.client.Accepted, traffic)
}

// runEtcdProxies hosts one etcd member's proxies in a process of their own.
func runEtcdProxies(raw string) int {
	spec, net, ok := readSpec[memberSpec]("testbed etcd proxies", raw)
	if !ok {
		return 2
	}
	px, err := listenEtcdProxies(spec, net)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testbed etcd proxies:", err)
		return 1
	}
	defer px.close()
	fmt.Println(readyLine)
	awaitEnd(px.serve(net))
	return 0
}

// awaitEnd returns on SIGTERM or SIGINT, or when parentGone closes.
func awaitEnd(parentGone <-chan struct{}) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case <-parentGone:
	}
}

// stdinClosed closes when stdin does, that is when the parent died: the
// end signal of a child that takes no control lines.
func stdinClosed() <-chan struct{} {
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(closed)
	}()
	return closed
}

func runMember(raw string) int {
	// The member's own proxies shape its links, in its process, as netem
	// would on its host: the client's process carries none of it. With
	// ProxiesApart a process of their own hosts them and takes the
	// control lines.
	spec, net, ok := readSpec[memberSpec]("testbed member", raw)
	if !ok {
		return 2
	}
	var parentGone <-chan struct{}
	if spec.ProxiesApart {
		parentGone = stdinClosed()
	} else {
		px, err := listenEtcdProxies(spec, net)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testbed member:", err)
			return 1
		}
		defer px.close()
		parentGone = px.serve(net)
	}

	e, err := startMemberServer(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testbed member:", err)
		if errors.Is(err, errBadSpec) {
			return 2
		}
		return 1
	}
	<-e.ready
	fmt.Println(readyLine)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case <-parentGone:
	case err := <-e.err:
		fmt.Fprintln(os.Stderr, "testbed member:", err)
		e.close()
		return 1
	case <-e.stopped:
		// Removed from the cluster (MemberRemove): etcd stops its server,
		// and a real member's process ends with it.
		fmt.Fprintln(os.Stderr, "testbed member: server stopped")
	}
	e.close()
	return 0
}

// childSpec is the spec a child process is started with; each carries the
// network state its proxies shape the links by.
type childSpec interface{ network() *netState }

func (s memberSpec) network() *netState  { return s.Net }
func (s zkProxySpec) network() *netState { return s.Net }

// readSpec decodes a child's spec and holds its network state for the
// proxies' shapes; who names the child in the error it prints.
func readSpec[S childSpec](who, raw string) (spec S, net *atomic.Pointer[netState], ok bool) {
	if err := json.Unmarshal([]byte(raw), &spec); err != nil || spec.network() == nil {
		fmt.Fprintf(os.Stderr, "%s: bad spec: %v\n", who, err)
		return spec, nil, false
	}
	net = new(atomic.Pointer[netState])
	net.Store(spec.network())
	return spec, net, true
}

// serveControl answers the parent's control lines on stdin: network state
// changes (acknowledged once applied: chunks in flight follow the new state
// and the proxies have rechecked their idle connections), the client
// proxy's accept count and the proxies' traffic. The returned channel
// closes when stdin does, that is when the parent died.
func serveControl(net *atomic.Pointer[netState], proxies []*proxy.Proxy, accepted func() uint64, traffic func() linkTraffic) <-chan struct{} {
	parentGone := make(chan struct{})
	go func() {
		defer close(parentGone)
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var c control
			if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
				fmt.Fprintln(os.Stderr, "testbed child: bad control line:", err)
				continue
			}
			switch {
			case c.Net != nil:
				net.Store(c.Net)
				for _, p := range proxies {
					p.Recheck()
				}
				fmt.Println(ackLine)
			case c.Query == "accepted":
				fmt.Println("accepted", accepted())
			case c.Query == "traffic":
				b, _ := json.Marshal(traffic()) // plain numbers: cannot fail
				fmt.Println("traffic", string(b))
			}
		}
	}()
	return parentGone
}

func portOf(rawURL string) int {
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0
	}
	var port int
	fmt.Sscanf(u.Port(), "%d", &port)
	return port
}

// memberServer is a member process's running etcd server.
type memberServer struct {
	ready   <-chan struct{} // serving
	err     <-chan error    // failed
	stopped <-chan struct{} // stopped by the cluster (removed)
	close   func()
}

// errBadSpec: a member spec no server can start from.
var errBadSpec = errors.New("bad member spec")
