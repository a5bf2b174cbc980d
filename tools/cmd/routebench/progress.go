package main

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress shows which run is under way and the time left, as a bar on a
// terminal and as one line per run otherwise.
type progress struct {
	mu      sync.Mutex
	bar     *progressbar.ProgressBar
	runs    int
	done    int
	total   time.Duration
	spent   time.Duration // planned length of finished runs
	current time.Duration
	started time.Time
	tick    *time.Ticker
	stop    chan struct{}
	wg      sync.WaitGroup
}

func newProgress() *progress { return &progress{} }

func (p *progress) Plan(runs int, total time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs, p.total = runs, total
	if term.IsTerminal(int(os.Stderr.Fd())) {
		p.bar = progressbar.NewOptions64(int64(total.Seconds()),
			progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionFullWidth(),
		)
		p.stop = make(chan struct{})
		p.tick = time.NewTicker(time.Second)
		p.wg.Go(p.loop)
	}
}

func (p *progress) loop() {
	for {
		select {
		case <-p.stop:
			return
		case <-p.tick.C:
			p.mu.Lock()
			if !p.started.IsZero() {
				at := p.spent + min(time.Since(p.started), p.current)
				p.bar.Set64(int64(at.Seconds()))
			}
			p.mu.Unlock()
		}
	}
}

func (p *progress) Start(label string, length time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started, p.current = time.Now(), length
	left := p.total - p.spent
	desc := fmt.Sprintf("[%d/%d] %s", p.done+1, p.runs, label)
	if p.bar != nil {
		p.bar.Describe(desc)
		return
	}
	fmt.Fprintf(os.Stderr, "%s (about %v left)\n", desc, left.Round(time.Second))
}

func (p *progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.spent += p.current
	p.started = time.Time{}
	if p.bar != nil {
		p.bar.Set64(int64(p.spent.Seconds()))
	}
}

func (p *progress) close() {
	p.mu.Lock()
	stop := p.stop
	p.stop = nil
	p.mu.Unlock()
	if stop != nil {
		close(stop)
		p.tick.Stop()
		p.wg.Wait()
		p.bar.Finish()
		fmt.Fprintln(os.Stderr)
	}
}
