package bench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

func init() { targets = append(targets, namedTarget{"etcd", etcdTarget}) }

// etcdTarget runs against one etcd server (a subprocess); every simulated process
// has its own client behind its own proxy, so that killing a process cuts it
// off without revoking its session, as kill -9 would.
func etcdTarget(b *testing.B) target {
	srv := testserver.StartEtcd(b)
	var n atomic.Int64
	// Count every message sent to the server: unary calls and stream sends
	// (keep-alives and watches are streams).
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return countingStream{s, &n}, nil
	}
	return target{
		name: "etcd",
		new: func(b *testing.B, cfg backend.Config) *process {
			proxy := testserver.StartProxy(b, srv.Endpoint())
			cli, err := clientv3.New(clientv3.Config{
				Endpoints:   []string{proxy.Addr()},
				DialTimeout: 2 * time.Second,
				Logger:      zap.NewNop(),
				DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)},
			})
			if err != nil {
				b.Fatal(err)
			}
			be, err := etcd.New(cli, etcd.Options{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = be.Close(ctx)
				_ = cli.Close()
			})
			return &process{backend: be, kill: proxy.Cut}
		},
		requests: n.Load,
	}
}

type countingStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (c countingStream) SendMsg(m any) error {
	c.n.Add(1)
	return c.ClientStream.SendMsg(m)
}
