package zk

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oproute/oproute/router"
)

// Collector returns the Conn's Prometheus metrics for the caller to
// register: the router's (router.Collector) and its sessions'
// (oproute_zk_session_moves_total, oproute_zk_session_expiries_total with
// label session = primary or member).
func (c *Conn) Collector() prometheus.Collector { return &zkCollector{c: c, router: c.r.Collector()} }

var (
	movesDesc    = prometheus.NewDesc("oproute_zk_session_moves_total", "Sessions established on another server than their last.", nil, nil)
	expiriesDesc = prometheus.NewDesc("oproute_zk_session_expiries_total", "Sessions ZooKeeper expired.", []string{"session"}, nil)
)

type zkCollector struct {
	c      *Conn
	router prometheus.Collector
}

func (z *zkCollector) Describe(ch chan<- *prometheus.Desc) {
	z.router.Describe(ch)
	ch <- movesDesc
	ch <- expiriesDesc
}

func (z *zkCollector) Collect(ch chan<- prometheus.Metric) {
	z.router.Collect(ch)
	ch <- prometheus.MustNewConstMetric(movesDesc, prometheus.CounterValue, float64(z.c.moves.Load()))
	ch <- prometheus.MustNewConstMetric(expiriesDesc, prometheus.CounterValue, float64(z.c.expiries[0].Load()), "primary")
	ch <- prometheus.MustNewConstMetric(expiriesDesc, prometheus.CounterValue, float64(z.c.expiries[1].Load()), "member")
}

// Stats returns the router's statistics.
func (c *Conn) Stats() router.Stats { return c.r.Stats() }
