package bench

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WriteFigures draws PNG figures in the spirit of the paper's: grouped bars
// per scenario (Figures 4 and 5) and the load sweep as lines (Figure 6);
// for the dominance grid, each cell's ratio to its best policy. Bars are
// means over trials. A scenario that ran on several layouts or CPU modes
// (the dominance grid) gets a figure for each.
func WriteFigures(dir string, comps []*Comparison) error {
	setups := map[string]map[string]bool{} // by scenario
	for _, c := range comps {
		if setups[c.Scenario] == nil {
			setups[c.Scenario] = map[string]bool{}
		}
		setups[c.Scenario][c.setup()] = true
	}
	type group struct {
		name, suffix, title string // title: "" or " (layout, CPU mode)"
		cs                  []*Comparison
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, c := range comps {
		g := &group{name: c.Scenario}
		if len(setups[c.Scenario]) > 1 {
			g.suffix = "_" + slug(c.Topology+"_"+CPUModeName(c.CPU))
			g.title = " (" + c.setup() + ")"
		}
		if old := byKey[g.name+g.suffix]; old != nil {
			g = old
		} else {
			byKey[g.name+g.suffix] = g
			groups = append(groups, g)
		}
		g.cs = append(g.cs, c)
	}
	for _, g := range groups {
		name, cs := g.name, g.cs
		file := func(base string) string { return filepath.Join(dir, base+g.suffix+".png") }
		var err error
		switch name {
		case ScenarioReadSize:
			err = variantBars(file("fig4_read_size"), "Pure reads: read P50 by response size (paper Fig. 4)"+g.title, cs, ReadP50)
		case ScenarioDegraded:
			err = metricBars(file("fig5_degraded"), "Degraded same-zone follower (paper Fig. 5)"+g.title, cs[0], []Metric{ReadP50, ReadP99, WriteP50, WriteP99})
		case ScenarioLoadSweep:
			err = sweepLines(file("fig6_load_sweep"), "5 members: write P50 by workers (paper Fig. 6)"+g.title, cs, WriteP50)
		case ScenarioTail, ScenarioZKTail:
			err = metricBars(file("fig_"+slug(name)), name+": a follower freezing 100–300 ms about once a second"+g.title, cs[0], []Metric{ReadP50, ReadP99, ReadP999})
		case ScenarioUneven:
			err = metricBars(file("fig_uneven"), "uneven: members of 0.6 / 0.2 / 0.6 cores"+g.title, cs[0], []Metric{ReadP50, ReadP99, WriteP50, WriteP99})
		case ScenarioDominance, ScenarioZKDominance:
			err = dominanceFigure(file("fig_"+slug(name)), name+" · "+cs[0].setup()+": read P50 ÷ the best policy but "+dominanceCandidate, cs, dominanceJudgedMetrics[0])
		case ScenarioFailover:
			continue
		default:
			err = variantBars(file("fig_"+slug(name)), name+": write P50 by mix"+g.title, cs, WriteP50)
		}
		if err != nil {
			return fmt.Errorf("bench: figure %s: %w", name, err)
		}
	}
	return nil
}

// slug makes s a file name's part: letters and digits, the rest "_".
func slug(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}

// dominanceFigure draws, per cell, each judged policy's ratio to the
// cell's best on jm (mean, error bars ± sd), with lines at 1 and at
// 1 + dominanceTolerance.
func dominanceFigure(path, title string, cs []*Comparison, jm judgedMetric) error {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = jm.name + " ÷ best"
	p.Legend.Top = true
	var labels []string
	for _, c := range cs {
		labels = append(labels, strings.ReplaceAll(c.Variant, ", ", "\n"))
	}
	for k, pol := range dominanceJudged {
		var pts ratioPoints
		for i, c := range cs {
			r := judge(c, jm, dominanceCandidate, dominanceJudged).ratios[k]
			if math.IsNaN(r.Mean) {
				continue
			}
			// Side by side around the cell's position.
			x := float64(i) + 0.15*(float64(k)-float64(len(dominanceJudged)-1)/2)
			pts.XYs = append(pts.XYs, plotter.XY{X: x, Y: r.Mean})
			pts.YErrors = append(pts.YErrors, struct{ Low, High float64 }{r.SD, r.SD})
		}
		if len(pts.XYs) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Color = plotutil.Color(k)
		sc.GlyphStyle.Shape = plotutil.Shape(k)
		bars, err := plotter.NewYErrorBars(pts)
		if err != nil {
			return err
		}
		bars.LineStyle.Color = plotutil.Color(k)
		p.Add(sc, bars)
		p.Legend.Add(pol, sc)
	}
	for _, ref := range []float64{1, 1 + dominanceTolerance} {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: ref}, {X: float64(len(cs)) - 0.5, Y: ref}})
		if err != nil {
			return err
		}
		if ref != 1 {
			l.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
	}
	p.NominalX(labels...)
	p.Y.Max += 0.15 * (p.Y.Max - p.Y.Min) // room for the legend
	return p.Save(max(vg.Length(140+70*len(cs))*vg.Points(1), 7*vg.Inch), 4*vg.Inch, path)
}

// ratioPoints are points with symmetric errors, for plotter.NewYErrorBars.
type ratioPoints struct {
	plotter.XYs
	plotter.YErrors
}

// save leaves headroom above the tallest bar for the legend, then writes.
func save(p *plot.Plot, w, h vg.Length, path string) error {
	p.Y.Max *= 1.15
	return p.Save(w, h, path)
}

func newPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Legend.Top = true
	return p
}

// variantBars draws one group of bars per variant, one bar per policy.
func variantBars(path, title string, cs []*Comparison, m Metric) error {
	p := newPlot(title, m.Name)
	var labels []string
	for _, c := range cs {
		labels = append(labels, c.Variant)
	}
	policies := cs[0].Policies
	width := min(vg.Points(float64(300)/float64(len(policies)*max(len(cs), 1))), vg.Points(24))
	if err := groupedBars(p, policies, len(cs), width, func(pol string, i int) float64 {
		return cs[i].Summary(pol, m).Mean
	}); err != nil {
		return err
	}
	p.NominalX(labels...)
	return save(p, vg.Length(140+90*len(cs))*vg.Points(1), 4*vg.Inch, path)
}

// metricBars draws one group per metric, one bar per policy.
func metricBars(path, title string, c *Comparison, ms []Metric) error {
	p := newPlot(title, "ms")
	var labels []string
	for _, m := range ms {
		labels = append(labels, m.Name)
	}
	if err := groupedBars(p, c.Policies, len(ms), vg.Points(18), func(pol string, i int) float64 {
		return c.Summary(pol, ms[i]).Mean
	}); err != nil {
		return err
	}
	p.NominalX(labels...)
	return save(p, 6*vg.Inch, 4*vg.Inch, path)
}

// groupedBars adds one bar series per policy, groups bars wide, side by
// side around each group's x position.
func groupedBars(p *plot.Plot, policies []string, groups int, width vg.Length, value func(policy string, group int) float64) error {
	for k, pol := range policies {
		vals := make(plotter.Values, groups)
		for i := range vals {
			vals[i] = nanZero(value(pol, i))
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(k)
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(k)-float64(len(policies)-1)/2)
		p.Add(bars)
		p.Legend.Add(pol, bars)
	}
	return nil
}

// sweepLines draws metric m against the number of workers, one line per policy.
func sweepLines(path, title string, cs []*Comparison, m Metric) error {
	p := newPlot(title, m.Name)
	p.X.Label.Text = "workers"
	var args []any
	for _, pol := range cs[0].Policies {
		pts := plotter.XYs{}
		for _, c := range cs {
			if len(c.Trials[pol]) == 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(c.Trials[pol][0].Workers), Y: nanZero(c.Summary(pol, m).Mean)})
		}
		args = append(args, pol, pts)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	return save(p, 6*vg.Inch, 4*vg.Inch, path)
}

func nanZero(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return x
}
