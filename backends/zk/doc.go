// Package zk is a ZooKeeper client with go-zookeeper's call shapes
// (github.com/go-zookeeper/zk) whose operations are routed by what they ask
// of ZAB:
//
//   - Writes (Create, CreateContainer, CreateTTL, Set, Delete, Multi,
//     SetACL, Reconfig, IncrementalReconfig) go to the leader, which
//     orders them; a follower would only forward them.
//
//   - Linearizable reads (Get, Exists, Children, their watch variants,
//     GetACL) are Sync(path) and then the read on the same session: the
//     sync makes the chosen server catch up with the leader, after which it
//     serves the read from its own copy. They are spread over the healthy
//     servers; a server whose reads drift far above the others' (a grey
//     failure) leaves the read pool until it recovers (package router).
//
//   - WithStaleReads makes reads plain ZooKeeper reads with no sync.
//
//   - WithQuorumReads makes linearizable reads strict: a quorum operation
//     (a Multi holding one version check of "/" at any version, committed
//     through the leader like a write, changing nothing) in place of the
//     sync, then the read.
//
// API is *zk.Conn's method set, which Conn has too (the compiler checks
// both): code typed on it moves from go-zookeeper to Conn by its Connect
// call alone. Each call to the ensemble has a Context variant bounded by a
// context, which go-zookeeper lacks.
//
// The router probes each server with the srvr four-letter word, which
// ZooKeeper answers whatever its 4lw.commands.whitelist says (3.5.3 on
// always adds srvr to it): no server setting is needed.
//
// Connect returns at once and connects in the background, as zk.Connect
// does; calls made meanwhile wait for a session, and a write made before
// the leader is known goes where the router sends it (a follower forwards
// it). WithConnectTimeout makes Connect wait for the router's probes and
// the primary session instead; when it then fails with ErrUnreachable, it
// wraps why the last probe failed.
//
// # Read consistency
//
// ZooKeeper's sync is not a quorum operation: the leader answers it from
// its own state (ZOOKEEPER-1675, ZOOKEEPER-3522). So sync+read, the default
// linearizable read here as in the paper, is linearizable while leadership
// is stable. A leader that was deposed while frozen (SIGSTOP, a GC pause
// longer than syncLimit × tickTime) still reports "Mode: leader" for a
// moment after it resumes (about a second on the test bed) and answers a
// sync, and the read after it, from state its successor has overwritten.
// The Conn guards against it as far as a client can: it moves its sessions
// off a server that stops answering probes (so none of its sessions is on
// the frozen leader when it resumes), ZooKeeper refuses to take back a
// session that has seen a newer zxid than the server's own, a new session
// is a quorum commit the deposed leader cannot make, and the router leaves
// out of the read pool a server that leads at an older epoch, or a follower
// more than Config.MaxLag transactions behind the leader (or still in an
// older epoch after the leader's first commit). TestDeposedLeaderReads
// measures it on a 5-server ensemble: the Conn's reads, default or strict,
// showed no stale read, while a plain session held on the old leader
// through the freeze read stale values for about a second with sync+get
// and none with the quorum check. With WithQuorumReads the read is ordered
// after a commit of the current leader's quorum, which a deposed leader
// cannot make: it is linearizable whatever the leadership does, for the
// cost of a write per read (a quorum round trip, a transaction in every
// server's log and, where the log is synced, a disk flush).
//
// The read pool's MinEjectGap defaults to DefaultMinEjectGap (10 ms): a
// linearizable read is two client round trips here, so a server one zone
// away is several milliseconds slower with nothing wrong with it.
//
//	conn, events, err := zk.Connect([]string{"z1:2181", "z2:2181", "z3:2181"}, 10*time.Second)
//
// # Sessions
//
// A Conn holds a primary session and, on demand, one session per server
// (at most one session of the Conn per server: the primary serves the
// server it is on). Each is a go-zookeeper session whose HostProvider
// offers the server the session belongs on first and whose dialer tells
// the Conn where it is, so that the Conn can move it: closing its TCP
// connection makes go-zookeeper reconnect elsewhere and resume the same
// session. The router's probes (the srvr four-letter command: every
// 250 ms while the Conn settles; settled, every 10 s or so, of the leader
// and the servers its calls went to, see Resources) drive the moves:
//
//   - The primary session follows the leader (the sticky server under the
//     sticky policy). When the leader changes, new requests are held back,
//     those in flight finish, the session reconnects to the new leader and
//     the held requests go on: no write is cut by a planned move.
//   - A session whose server stops answering probes (killed, partitioned,
//     or frozen with its TCP connections open) is moved at once, about a
//     second after the server stops answering, instead of after
//     go-zookeeper's receive timeout (two thirds of the session timeout).
//     An idle Conn probes no follower, so the connection of every session
//     that may hold watches, silent for 1.5 s, sends a ZooKeeper ping of
//     its own; no byte back within 400 ms counts as a failed probe of the
//     server, which the router then probes at once. Reads in flight there are retried once on another server; writes in
//     flight fail with zk.ErrConnectionClosed (their outcome is unknown,
//     and they are never retried).
//   - A member session that had to leave its server goes back when the
//     server answers again.
//   - A frozen leader stops writes until ZooKeeper replaces it (syncLimit ×
//     tickTime); the primary session then reaches the new leader at once
//     (its HostProvider backs off 10 to 250 ms between passes, not
//     go-zookeeper's second) and keeps its session if ZooKeeper does.
//
// What that means for ZooKeeper's guarantees:
//
//   - Ephemeral nodes are created on the primary session (SessionID), so
//     they live as long as it does and survive leader changes and server
//     losses that the session outlives.
//   - Watches live on the session that served the read that set them. When
//     its server goes away the session moves and go-zookeeper re-registers
//     them on the new server (SetWatches with the last zxid seen), so a
//     change made meanwhile still fires the watch. If that session expires,
//     its watches end with an EventNotWatching carrying zk.ErrSessionExpired.
//   - FIFO order holds per session. One goroutine's calls are sequential
//     (each returns after ZooKeeper answered), so a write is applied before
//     the caller's next call starts, whatever session carries it.
//   - Read-your-writes across the Conn's sessions holds for linearizable
//     reads, by the sync; stale reads may miss a write the Conn made through
//     another server.
//   - Session expiry of the primary session is an event (zk.StateExpired on
//     the channel and WithEventCallback; the callback runs on a goroutine of
//     the Conn's, so it may call Close) and, from then on, every call
//     returns zk.ErrSessionExpired: unlike go-zookeeper, the Conn never goes
//     on silently with a new session that lost the ephemerals. Make a new
//     Conn. Member sessions own nothing but watches; go-zookeeper renews
//     them on expiry and their watches are ended as above.
//
// # Resources
//
// A Conn holds a primary session and at most one session per server (about
// one connection per server: the primary's server needs no other).
// ZooKeeper allows one client address maxClientCnxns connections to a
// server (60 by default): one host runs about 59 Conns against servers at
// that default. Probes (srvr, one short connection each) are shared by the
// Conns of a process that probe a server the same way (see WithDialer,
// WithTLS): while the Conns are not settled, about 8 probe connections a
// second per server, however many Conns (with 20 unshared Conns it was 80 a
// second); settled, each Conn probes the leader and the servers it sent
// calls to since their last probe every 10 s or so (the router's
// StableProbeInterval) and never a server it leaves idle (IdleProbeRounds
// -1: each probe is a new connection), so a server sees at most 0.1 probe
// connections a second per unshared Conn that uses it, and fewer shared.
//
// Close refuses later calls, and waits, once go-zookeeper's own Close has
// returned (up to a second, for the server's answer), at most 3 s for the
// calls in flight (those whose caller gave up included) and for
// go-zookeeper's goroutines.
// The connections the Conn dials report a failed write as written and close
// themselves, so that go-zookeeper sees the failure once, through the
// receive side: its sendData answers a failed request itself and leaves it
// registered, and when that request is the credentials it resends on
// reconnect, its flushRequests later blocks for ever on the full reply slot
// (go-zookeeper PR #163). The same fix upstream is a change to sendData:
// answer a failed write only if the request is still registered (remove it
// under requestsLock first), or leave the answer to flushRequests.
// On a session that has set a watch, a connection also hands go-zookeeper
// no reply carrying a zxid before go-zookeeper has sent the request that
// re-registers the watches: its loop reads lastZxid for that request while
// its receive loop, already running, writes it for the replies to calls
// that waited out the disconnection, and nothing orders the two (a data
// race the race detector reports; the value read is right either way). A
// session whose watches have all fired sends no such request: its first
// reply after a reconnect waits half a second at most. Upstream, reading
// lastZxid before starting the receive loop fixes the same.
//
// A session that has had no server for longer than the session timeout,
// its go-zookeeper loop beginning no dial and establishing nothing, while
// some server answers the Conn's probes is taken for wedged (its
// go-zookeeper loop stuck: a dial or write that ignores its deadline, a bug)
// and the event zk_session_wedged logged: a member session is closed and
// left behind, and the next call on its server opens a new one; the primary
// session, after twice the session timeout (ZooKeeper has expired it by
// then unless a server raised the timeout), counts as expired, as above
// (calls already waiting on it end with their context). A primary never
// yet established is only told of, once (never_established): ZooKeeper
// holds nothing of it to expire, and the Conn waits on. Only time during
// which some server serves counts: ZooKeeper keeps sessions through an
// election or an ensemble restart. The goroutines of a session left
// behind that way end when its loop gets out; Close waits for them no
// longer than for its own sessions (3 s), after at most 3 s for a
// replacement under way.
//
// # Recipes and TLS
//
// Lock is go-zookeeper's lock recipe on a Conn (go-zookeeper's recipes take
// a *zk.Conn). WithTLS connects over TLS to servers' secureClientPort.
//
// # Errors
//
// AddAuth adds credentials to the primary session before it returns (its
// answer is AddAuth's error) and to every other session before that
// session's next request, whenever the session was opened; a credential
// cut by a move is added again before the session's next request.
// WithMember puts the call on that server or fails with ErrUnreachable: it
// never runs elsewhere.
//
// ZooKeeper's answers are go-zookeeper's own error values, unwrapped
// (zk.ErrNoNode, zk.ErrNodeExists, zk.ErrBadVersion…), so err == zk.ErrNoNode
// and errors.Is keep working. The Conn's own conditions are ErrClosed (also
// errors.Is zk.ErrClosing), ErrUnreachable, ErrNoServers, ErrInvalidServer,
// ErrMultiRolledBack and the router's configuration errors; a cancelled or
// expired context returns ctx.Err().
//
// # Policies
//
// router.Hybrid (default) as above; router.Sticky is go-zookeeper's own
// behaviour: everything on the primary session, on one server, which
// changes only when that server stops answering; router.RoundRobin rotates
// every operation over the servers (one session per server);
// router.LeaderOnly and router.Boltzmann as in package router.
package zk
