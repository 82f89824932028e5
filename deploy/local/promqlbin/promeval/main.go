// Command promeval evaluates PromQL expressions with Prometheus' own engine over scraped
// exposition text, for the dashboard test (tests/e2e/test_dashboard.py).
//
// It reads one JSON request on stdin: scrapes (each target's exposition text at a time, in
// time order) and queries; it writes one JSON answer on stdout. Each scrape is stored the
// way Prometheus' scrape loop stores it: the text parsed by the parser Prometheus uses for the
// content type, the target's labels added (a label the metric carries wins, as with
// honor_labels: true), and a staleness marker for each series the target showed in its
// previous scrape but not in this one. Each query is parsed (its metric names listed) and run
// as a range query, as Grafana runs a time-series panel's query.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

type scrape struct {
	// Target labels (job, instance, ...), as service discovery and relabelling give them.
	Target      map[string]string `json:"target"`
	TimeMs      int64             `json:"time_ms"`
	ContentType string            `json:"content_type"`
	Text        string            `json:"text"`
}

type query struct {
	Expr    string `json:"expr"`
	StartMs int64  `json:"start_ms"`
	EndMs   int64  `json:"end_ms"`
	StepMs  int64  `json:"step_ms"`
}

type request struct {
	Scrapes []scrape `json:"scrapes"`
	Queries []query  `json:"queries"`
}

type series struct {
	Labels map[string]string `json:"labels"`
	Points int               `json:"points"`
	// Points with a number Grafana can draw: neither NaN nor infinite.
	Finite int `json:"finite"`
	// The last point's value as Prometheus' HTTP API writes it ("NaN" and "+Inf" included).
	Last string `json:"last"`
}

type answer struct {
	Expr string `json:"expr"`
	// ParseError: the expression is not PromQL; Error: it parsed but did not evaluate.
	ParseError string   `json:"parse_error,omitempty"`
	Error      string   `json:"error,omitempty"`
	Metrics    []string `json:"metrics"`
	Series     []series `json:"series"`
}

type response struct {
	Samples int      `json:"samples"`
	Answers []answer `json:"answers"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "promeval:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var req request
	if err := json.NewDecoder(in).Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	dir, err := os.MkdirTemp("", "promeval-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := tsdb.Open(dir, nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		return fmt.Errorf("opening a TSDB in %s: %w", dir, err)
	}
	defer db.Close()
	samples, err := store(db, req.Scrapes)
	if err != nil {
		return err
	}
	pql := parser.NewParser(parser.Options{})
	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples:           50_000_000,
		Timeout:              time.Minute,
		LookbackDelta:        5 * time.Minute,
		EnableAtModifier:     true,
		EnableNegativeOffset: true,
		Parser:               pql,
	})
	resp := response{Samples: samples, Answers: make([]answer, 0, len(req.Queries))}
	for _, q := range req.Queries {
		resp.Answers = append(resp.Answers, evaluate(engine, pql, db, q))
	}
	return json.NewEncoder(out).Encode(resp)
}

// store appends every scrape's samples as the scrape loop would; it returns how many.
func store(db *tsdb.DB, scrapes []scrape) (int, error) {
	ctx := context.Background()
	symbols := labels.NewSymbolTable()
	// The series each target showed in its last scrape, to mark those it no longer shows stale.
	previous := map[string]map[string]labels.Labels{}
	total := 0
	for _, s := range scrapes {
		target := labels.FromMap(s.Target)
		key := target.String()
		parsed, err := textparse.New([]byte(s.Text), s.ContentType, symbols, textparse.ParserOptions{})
		if parsed == nil {
			return total, fmt.Errorf("scrape of %s: %w", key, err)
		}
		app := db.Appender(ctx)
		seen := map[string]labels.Labels{}
		for {
			entry, err := parsed.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return total, fmt.Errorf("scrape of %s at %d: %w", key, s.TimeMs, err)
			}
			if entry != textparse.EntrySeries {
				continue
			}
			_, _, v := parsed.Series()
			var metric labels.Labels
			parsed.Labels(&metric)
			builder := labels.NewBuilder(metric)
			target.Range(func(l labels.Label) {
				if !metric.Has(l.Name) {
					builder.Set(l.Name, l.Value)
				}
			})
			lset := builder.Labels()
			seen[lset.String()] = lset
			if _, err := app.Append(0, lset, s.TimeMs, v); err != nil {
				return total, fmt.Errorf("appending %s: %w", lset, err)
			}
			total++
		}
		for id, lset := range previous[key] {
			if _, still := seen[id]; !still {
				if _, err := app.Append(0, lset, s.TimeMs, math.Float64frombits(value.StaleNaN)); err != nil {
					return total, fmt.Errorf("marking %s stale: %w", lset, err)
				}
			}
		}
		previous[key] = seen
		if err := app.Commit(); err != nil {
			return total, err
		}
	}
	return total, nil
}

func evaluate(engine *promql.Engine, pql parser.Parser, db storage.Queryable, q query) answer {
	a := answer{Expr: q.Expr, Metrics: []string{}, Series: []series{}}
	expr, err := pql.ParseExpr(q.Expr)
	if err != nil {
		a.ParseError = err.Error()
		return a
	}
	names := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if selector, ok := node.(*parser.VectorSelector); ok {
			for _, m := range selector.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					names[m.Value] = true
				}
			}
		}
		return nil
	})
	for name := range names {
		a.Metrics = append(a.Metrics, name)
	}
	sort.Strings(a.Metrics)
	rq, err := engine.NewRangeQuery(
		context.Background(), db, nil, q.Expr,
		time.UnixMilli(q.StartMs), time.UnixMilli(q.EndMs), time.Duration(q.StepMs)*time.Millisecond,
	)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	defer rq.Close()
	result := rq.Exec(context.Background())
	if result.Err != nil {
		a.Error = result.Err.Error()
		return a
	}
	matrix, err := result.Matrix()
	if err != nil {
		a.Error = err.Error()
		return a
	}
	for _, s := range matrix {
		out := series{Labels: s.Metric.Map(), Points: len(s.Floats) + len(s.Histograms)}
		for _, p := range s.Floats {
			if !math.IsNaN(p.F) && !math.IsInf(p.F, 0) {
				out.Finite++
			}
		}
		if n := len(s.Floats); n > 0 {
			out.Last = strconv.FormatFloat(s.Floats[n-1].F, 'f', -1, 64)
		}
		a.Series = append(a.Series, out)
	}
	return a
}
