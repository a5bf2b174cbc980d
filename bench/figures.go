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
// per scenario (Figures 4 and 5) and the load sweep as lines (Figure 6).
// Bars are means over trials.
func WriteFigures(dir string, comps []*Comparison) error {
	byScenario := map[string][]*Comparison{}
	var order []string
	for _, c := range comps {
		if _, ok := byScenario[c.Scenario]; !ok {
			order = append(order, c.Scenario)
		}
		byScenario[c.Scenario] = append(byScenario[c.Scenario], c)
	}
	for _, name := range order {
		cs := byScenario[name]
		var err error
		switch name {
		case ScenarioReadSize:
			err = variantBars(filepath.Join(dir, "fig4_read_size.png"), "Pure reads: read P50 by response size (paper Fig. 4)", cs, ReadP50)
		case ScenarioDegraded:
			err = metricBars(filepath.Join(dir, "fig5_degraded.png"), "Degraded same-zone follower (paper Fig. 5)", cs[0], []Metric{ReadP50, ReadP99, WriteP50, WriteP99})
		case ScenarioLoadSweep:
			err = sweepLines(filepath.Join(dir, "fig6_load_sweep.png"), "5 members: write P50 by workers (paper Fig. 6)", cs, WriteP50)
		case ScenarioTail, ScenarioZKTail:
			err = metricBars(filepath.Join(dir, "fig_"+strings.ReplaceAll(name, "-", "_")+".png"), name+": a follower freezing 100–300 ms about once a second", cs[0], []Metric{ReadP50, ReadP99, ReadP999})
		case ScenarioUneven:
			err = metricBars(filepath.Join(dir, "fig_uneven.png"), "uneven: members of 0.6 / 0.2 / 0.6 cores", cs[0], []Metric{ReadP50, ReadP99, WriteP50, WriteP99})
		case ScenarioFailover:
			continue
		default:
			err = variantBars(filepath.Join(dir, "fig_"+strings.ReplaceAll(name, "-", "_")+".png"), name+": write P50 by mix", cs, WriteP50)
		}
		if err != nil {
			return fmt.Errorf("bench: figure %s: %w", name, err)
		}
	}
	return nil
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
