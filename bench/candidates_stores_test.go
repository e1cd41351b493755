package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	batondynamodb "github.com/batonhq/baton/backend/dynamodb"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// The BenchmarkTenThousandCandidates workers of Consul, Redis, PostgreSQL
// and DynamoDB, and taps that count their requests by type.

func init() {
	candBackends = append(candBackends,
		candBackend{name: "consul", start: candConsul, backends: candConsulBackends},
		candBackend{name: "redis", start: candRedis, backends: candRedisBackends},
		candBackend{name: "postgres", start: candPostgres, backends: candPostgresBackends},
		candBackend{name: "dynamodb", start: candDynamo, backends: candDynamoBackends},
	)
}

func candConsul(b *testing.B) candServer {
	srv := testserver.StartConsul(b, testserver.ConsulOptions{HTTPMaxConnsPerClient: 15000})
	return candServer{addr: srv.Addr(), tap: httpTap}
}

func candConsulBackends(spec candSpec) (func() (baton.Backend, error), func(), error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Every waiting candidate's blocking query holds a connection.
	tr.MaxIdleConnsPerHost = spec.N + 8
	client, err := api.NewClient(&api.Config{Address: spec.Addr, HttpClient: &http.Client{Transport: tr}})
	if err != nil {
		return nil, nil, err
	}
	return func() (baton.Backend, error) {
		return consul.New(client, consul.Options{Config: backend.Config{TTL: spec.TTL}})
	}, tr.CloseIdleConnections, nil
}

func candRedis(b *testing.B) candServer {
	srv := testserver.StartRedis(b, testserver.RedisOptions{Config: []string{"maxclients 65000"}})
	return candServer{addr: srv.Addr(), tap: redisTap, watches: func() (string, error) {
		out, err := exec.Command("redis-cli", "-p", srv.Addr()[strings.LastIndex(srv.Addr(), ":")+1:], "PUBSUB", "NUMSUB", redis.Channel("")).Output()
		return strings.Join(strings.Fields(string(out)), " ") + " (channel, subscribers)", err
	}}
}

func candRedisBackends(spec candSpec) (func() (baton.Backend, error), func(), error) {
	c := goredis.NewClient(&goredis.Options{Addr: spec.Addr, ContextTimeoutEnabled: true, DialTimeout: 5 * time.Second, PoolSize: 64})
	return func() (baton.Backend, error) {
		return redis.New(context.Background(), c, redis.Options{Config: backend.Config{TTL: spec.TTL}, Logger: candTraceLog()})
	}, func() { _ = c.Close() }, nil
}

func candPostgres(b *testing.B) candServer {
	db := testserver.SharedPostgres(b).NewDatabase(b)
	u, err := url.Parse(db)
	if err != nil {
		b.Fatal(err)
	}
	return candServer{addr: u.Host, tap: pgTap, dsn: db}
}

func candPostgresBackends(spec candSpec) (func() (baton.Backend, error), func(), error) {
	u, err := url.Parse(spec.DSN)
	if err != nil {
		return nil, nil, err
	}
	u.Host = spec.Addr
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, nil, err
	}
	// The worker's one Backend: its LISTEN connection, its renewals and
	// the statements of the one candidate that campaigns on the store at
	// a time (the others take turns in the process), and room for a
	// release and a leave beside them: 10 processes stay well within the
	// test cluster's 300 connections.
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, nil, err
	}
	return func() (baton.Backend, error) {
		return postgres.New(context.Background(), pool, postgres.Options{Config: backend.Config{TTL: spec.TTL}, Logger: candTraceLog()})
	}, pool.Close, nil
}

func candDynamo(b *testing.B) candServer {
	d := dynamoTable(b)
	return candServer{addr: d.Addr, tap: dynamoTap}
}

func candDynamoBackends(spec candSpec) (func() (baton.Backend, error), func(), error) {
	client := dynamoClient("http://"+spec.Addr, new(dynamoCounts))
	return func() (baton.Backend, error) {
		return batondynamodb.New(context.Background(), client, batondynamodb.Options{Config: backend.Config{TTL: spec.TTL}, Table: "baton-bench", Logger: candTraceLog()})
	}, func() {}, nil
}

// dynamoTap counts the DynamoDB API calls a client sends, by operation.
func dynamoTap(c *reqCounter) func() io.Writer {
	return func() io.Writer {
		return pipeTap(c, func(r io.Reader) error {
			br := bufio.NewReader(r)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return err
				}
				c.add(strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "DynamoDB_20120810."))
				if _, err := io.Copy(io.Discard, req.Body); err != nil {
					return err
				}
			}
		})
	}
}

// redisTap counts the commands a Redis client sends, by name: each is an
// array of bulk strings (RESP), its first the command's name.
func redisTap(c *reqCounter) func() io.Writer {
	return func() io.Writer {
		return pipeTap(c, func(r io.Reader) error {
			br := bufio.NewReader(r)
			line := func() (string, error) {
				s, err := br.ReadString('\n')
				return strings.TrimRight(s, "\r\n"), err
			}
			for {
				h, err := line()
				if err != nil {
					return err
				}
				if !strings.HasPrefix(h, "*") {
					c.add("inline " + strings.ToUpper(strings.Fields(h + " ?")[0]))
					continue
				}
				n, err := strconv.Atoi(h[1:])
				if err != nil {
					return fmt.Errorf("RESP array header %q", h)
				}
				name := ""
				for i := range n {
					l, err := line()
					if err != nil {
						return err
					}
					size, err := strconv.Atoi(strings.TrimPrefix(l, "$"))
					if err != nil || !strings.HasPrefix(l, "$") {
						return fmt.Errorf("RESP bulk header %q", l)
					}
					buf := make([]byte, size+2)
					if _, err := io.ReadFull(br, buf); err != nil {
						return err
					}
					if i == 0 {
						name = strings.ToUpper(string(buf[:size]))
					}
				}
				c.add(name)
			}
		})
	}
}

// pgTap counts the statements a PostgreSQL client runs, by their SQL's
// first words: a simple query ('Q') is one; in the extended protocol each
// Bind of a prepared statement is one, named by the SQL its Parse gave it.
func pgTap(c *reqCounter) func() io.Writer {
	return func() io.Writer {
		return pipeTap(c, func(r io.Reader) error {
			br := bufio.NewReader(r)
			var hdr [8]byte
			// Startup: length, then a protocol code; an SSLRequest or a
			// GSSENCRequest (answered by one byte) may come first.
			for {
				if _, err := io.ReadFull(br, hdr[:]); err != nil {
					return err
				}
				n := int(binary.BigEndian.Uint32(hdr[:4]))
				code := binary.BigEndian.Uint32(hdr[4:])
				if _, err := io.CopyN(io.Discard, br, int64(n-8)); err != nil {
					return err
				}
				if code != 80877103 && code != 80877104 {
					break
				}
			}
			prepared := map[string]string{}
			for {
				t, err := br.ReadByte()
				if err != nil {
					return err
				}
				if _, err := io.ReadFull(br, hdr[:4]); err != nil {
					return err
				}
				body := make([]byte, int(binary.BigEndian.Uint32(hdr[:4]))-4)
				if _, err := io.ReadFull(br, body); err != nil {
					return err
				}
				cstr := func(b []byte) (string, []byte) {
					i := bytes.IndexByte(b, 0)
					if i < 0 {
						return string(b), nil
					}
					return string(b[:i]), b[i+1:]
				}
				switch t {
				case 'Q':
					q, _ := cstr(body)
					c.add(sqlKind(q))
				case 'P':
					name, rest := cstr(body)
					q, _ := cstr(rest)
					prepared[name] = sqlKind(q)
				case 'B':
					_, rest := cstr(body)
					stmt, _ := cstr(rest)
					if k, ok := prepared[stmt]; ok {
						c.add(k)
					} else {
						c.add("EXECUTE ?")
					}
				}
			}
		})
	}
}

// sqlKind names a statement by its first words, whitespace collapsed.
func sqlKind(q string) string {
	f := strings.Fields(q)
	if len(f) > 6 {
		f = f[:6]
	}
	return strings.Join(f, " ")
}

// candTrace is a worker's trace (see candTraceLog), opened once.
var candTrace = sync.OnceValue(func() *slog.Logger {
	dir := os.Getenv("BATON_BENCH_TRACE")
	spec := os.Getenv(envCandWorker)
	if dir == "" || spec == "" {
		return nil
	}
	var s candSpec
	if json.Unmarshal([]byte(spec), &s) != nil {
		return nil
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-p%d.log", s.Backend, s.Proc)))
	if err != nil {
		return nil
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey && len(groups) == 0 {
			return slog.Int64("us", a.Value.Time().UnixMicro())
		}
		return a
	}}))
})

// candTraceLog returns the logger for a worker's Backend: with
// BATON_BENCH_TRACE=DIR, its debug lines (a release sent, a wake-up
// received, a lease acquired) and the worker's own (RESIGNED, WON), each
// with the time in microseconds, go to DIR/BACKEND-pN.log, so that a
// hand-over can be followed from the resigner's Resign to the winner's
// Campaign returning (the files share one host's clock). Nil, silent,
// without it.
func candTraceLog() *slog.Logger { return candTrace() }

// candTraceEvent writes a worker's event to its trace, if it keeps one.
func candTraceEvent(msg string, args ...any) {
	if l := candTrace(); l != nil {
		l.Info(msg, args...)
	}
}
