package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// exchange runs the TCP handshake of the pingpong tools. The client sends
// its address messages first; the server reads them, connects its QPs
// (connect) and only then answers with its own, so that the client's first
// SEND finds the server ready; the client then connects and sends "done".
// local holds every message this side sends (srq_pingpong always sends
// MaxQP of them); as many are read from the peer.
func exchange(ctx context.Context, cfg *Config, local []Dest, connect func([]Dest) error) ([]Dest, error) {
	conn, err := dialOrAccept(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// Closing the connection when ctx ends unblocks reads and writes at
	// once (an interrupt, or the run's timeout).
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	return exchangeOn(ctx, conn, cfg, local, connect)
}

func dialOrAccept(ctx context.Context, cfg *Config) (net.Conn, error) {
	if cfg.Server != "" {
		dial := cfg.Dial
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		addr := net.JoinHostPort(cfg.Server, strconv.Itoa(cfg.Port))
		var conn net.Conn
		var err error
		for {
			conn, err = dial(ctx, "tcp", addr)
			if err == nil || ctx.Err() != nil {
				break
			}
			// The tools' client gives up at once; retrying briefly lets a
			// script start both sides together.
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err != nil {
			return nil, fmt.Errorf("couldn't connect to %s: %w (is the %s server running there, with the same -p?)", addr, err, cfg.Type.Tool())
		}
		return conn, nil
	}
	listen := cfg.Listen
	if listen == nil {
		listen = net.Listen
	}
	ln, err := listen("tcp", ":"+strconv.Itoa(cfg.Port))
	if err != nil {
		return nil, fmt.Errorf("listen on TCP port %d: %w (choose another with -p)", cfg.Port, err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	ln.Close()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("waiting for a client on TCP port %d: %w", cfg.Port, err)
	}
	return conn, nil
}

// exchangeOn is the exchange on an established connection.
func exchangeOn(ctx context.Context, conn io.ReadWriter, cfg *Config, local []Dest, connect func([]Dest) error) ([]Dest, error) {
	send := func() error {
		msgs := make([]byte, 0, len(local)*MsgLen)
		for _, d := range local {
			msgs = append(msgs, d.Marshal()...)
		}
		if _, err := conn.Write(msgs); err != nil {
			return fmt.Errorf("send the local address: %w", ctxErr(ctx, err))
		}
		return nil
	}
	recv := func() ([]Dest, error) {
		rem, err := readDests(conn, len(local), cfg)
		if err != nil {
			return nil, ctxErr(ctx, err)
		}
		if err := connect(rem); err != nil {
			return nil, err
		}
		return rem, nil
	}
	if cfg.Server != "" {
		if err := send(); err != nil {
			return nil, err
		}
		rem, err := recv()
		if err != nil {
			return nil, err
		}
		if _, err := conn.Write([]byte("done\x00")); err != nil {
			return nil, fmt.Errorf("send \"done\": %w", ctxErr(ctx, err))
		}
		return rem, nil
	}
	rem, err := recv()
	if err != nil {
		return nil, err
	}
	if err := send(); err != nil {
		return nil, err
	}
	// The client's "done" says it has connected; its content is not
	// checked, as the tools do not check it.
	done := make([]byte, 5)
	if n, err := io.ReadFull(conn, done); err != nil && n == 0 {
		return nil, fmt.Errorf("the client closed the connection without sending \"done\" (%v): see its output", ctxErr(ctx, err))
	}
	return rem, nil
}

// readDests reads n address messages.
func readDests(r io.Reader, n int, cfg *Config) ([]Dest, error) {
	buf := make([]byte, MsgLen)
	rem := make([]Dest, n)
	for i := range rem {
		got, err := io.ReadFull(r, buf)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				what := "its address"
				if n > 1 {
					what = fmt.Sprintf("address %d of %d", i+1, n)
				}
				return nil, fmt.Errorf("the peer closed the connection after %d of the %d bytes of %s: is it %s (the same type, see its output)?", got, MsgLen, what, cfg.Type.Tool())
			}
			return nil, fmt.Errorf("read the remote address: %w", err)
		}
		d, err := ParseDest(buf)
		if err != nil {
			if n > 1 {
				return nil, fmt.Errorf("address %d of %d: %w", i+1, n, err)
			}
			return nil, err
		}
		rem[i] = d
	}
	return rem, nil
}

// ctxErr prefers the context's reason (interrupt, timeout) over the error
// of the I/O it cut short.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
