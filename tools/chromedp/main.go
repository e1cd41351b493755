// Command chromedp-driver drives a headless Chromium with chromedp for the
// browser tests (internal/testserver.StartBrowser), in a module of its own
// so that the main module does not depend on chromedp.
//
// It starts the browser given by -chromium with exactly the -flag flags and
// -user-data-dir, prints the browser's process ID as its first answer, then
// reads one JSON request a line from stdin and answers each with one JSON
// line on stdout. The browser's own output goes to stderr. When stdin ends,
// or -timeout has passed since the start, it kills the browser, waits for
// it and exits.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
)

// request is one step. Op is navigate (URL), viewport (Width, Height), poll
// (JS, IntervalMS, TimeoutMS: until JS is true), eval (JS), text (CSS) or
// screenshot (Quality: a full-page PNG).
type request struct {
	Op         string `json:"op"`
	URL        string `json:"url,omitempty"`
	JS         string `json:"js,omitempty"`
	CSS        string `json:"css,omitempty"`
	Width      int64  `json:"width,omitempty"`
	Height     int64  `json:"height,omitempty"`
	IntervalMS int64  `json:"interval_ms,omitempty"`
	TimeoutMS  int64  `json:"timeout_ms,omitempty"`
	Quality    int    `json:"quality,omitempty"`
}

// response answers a request: Err is empty on success, and Value holds the
// result as JSON (a string, a number, the script's value, or the PNG's
// bytes, base64-encoded).
type response struct {
	Err   string `json:"err,omitempty"`
	Value any    `json:"value,omitempty"`
}

type flagList []string

func (f *flagList) String() string     { return strings.Join(*f, ",") }
func (f *flagList) Set(s string) error { *f = append(*f, s); return nil }

func main() {
	var (
		bin, dataDir string
		flags        flagList
		timeout      time.Duration
	)
	flag.StringVar(&bin, "chromium", "", "the browser binary")
	flag.StringVar(&dataDir, "user-data-dir", "", "the browser's profile directory")
	flag.Var(&flags, "flag", "a browser flag without its leading --, repeatable")
	flag.DurationVar(&timeout, "timeout", 3*time.Minute, "how long the driver and its browser may run")
	flag.Parse()
	if bin == "" || dataDir == "" {
		fmt.Fprintln(os.Stderr, "chromedp-driver: -chromium and -user-data-dir are required")
		os.Exit(2)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(dataDir),
		chromedp.CombinedOutput(os.Stderr),
	}
	for _, f := range flags {
		opts = append(opts, chromedp.Flag(f, true))
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	// Cancelling the allocator kills the browser and waits for it.
	defer cancelAlloc()
	ctx, cancelBrowser := chromedp.NewContext(ctx)
	defer cancelBrowser()

	out := json.NewEncoder(os.Stdout)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		_ = out.Encode(response{Err: err.Error()})
		return
	}
	_ = out.Encode(response{Value: chromedp.FromContext(ctx).Browser.Process().Pid})

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<20)
	for in.Scan() {
		var req request
		var resp response
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp.Err = "bad request: " + err.Error()
		} else if v, err := do(ctx, req); err != nil {
			resp.Err = err.Error()
		} else {
			resp.Value = v
		}
		if err := out.Encode(resp); err != nil {
			return
		}
	}
}

func do(ctx context.Context, req request) (any, error) {
	switch req.Op {
	case "navigate":
		return nil, chromedp.Do(ctx, chromedp.Navigate(req.URL))
	case "viewport":
		return nil, chromedp.Do(ctx, chromedp.EmulateViewport(req.Width, req.Height))
	case "poll":
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](req.JS,
			chromedp.WithPollingInterval(time.Duration(req.IntervalMS)*time.Millisecond),
			chromedp.WithPollingTimeout(time.Duration(req.TimeoutMS)*time.Millisecond)))
		return nil, err
	case "eval":
		return chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](req.JS))
	case "text":
		return chromedp.Run(ctx, chromedp.Text(chromedp.CSS(req.CSS)))
	case "screenshot":
		return chromedp.Run(ctx, chromedp.FullScreenshot(req.Quality))
	}
	return nil, errors.New("unknown op " + strconv.Quote(req.Op))
}
