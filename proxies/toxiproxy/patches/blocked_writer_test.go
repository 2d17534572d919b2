// Regression test for the control API wedging while a link's writer is
// blocked (upstream report "control port hangs on removing a toxic", still open): a client that stops reading fills
// its socket, the last toxic on the link blocks forever in `Output <- chunk`,
// and adding, removing or resetting a toxic on that proxy waits for the
// toxic to take an interrupt it can no longer see, holding the collection's
// lock, so every later API call on the proxy hangs too.
//
// The streamlab lab hits this whenever a scenario toggles toxics while a slow
// reader is connected. Applied to the pinned module source by
// scripts/install_toxiproxy.sh; it hangs (and fails on its deadline) on the
// unpatched source, and passes with the patch beside it.
package toxiproxy_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/testhelper"
)

// A pattern the reader can verify: byte i of the stream is a function of i,
// so a lost, repeated or reordered chunk is seen.
func patternByte(i uint64) byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], i*2654435761)
	return b[3]
}

// startBlockedLink opens a connection through `proxy` to an upstream that
// writes the pattern as fast as it can, and returns once no byte has gone
// through for 300 ms: every buffer on the way (the upstream's socket, the
// link's channels, the client's socket) is full and the link's writer is
// blocked on a client that is not reading.
func startBlockedLink(t *testing.T, toxicsJSON ...string,
) (*toxiproxy.Proxy, net.Conn, *atomic.Uint64, func()) {
	t.Helper()
	upstream := testhelper.NewUpstream(t, false)
	proxy := NewTestProxy("blocked", upstream.Addr())
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	for _, body := range toxicsJSON {
		if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			t.Fatal(err)
		}
	}
	client, err := net.Dial("tcp", proxy.Listen)
	if err != nil {
		t.Fatal(err)
	}
	server := <-upstream.Connections
	var written atomic.Uint64
	go func() {
		buf := make([]byte, 4096)
		for {
			base := written.Load()
			for i := range buf {
				buf[i] = patternByte(base + uint64(i))
			}
			n, err := server.Write(buf)
			written.Add(uint64(n))
			if err != nil {
				return
			}
		}
	}()
	last, since := uint64(0), time.Now()
	deadline := time.Now().Add(10 * time.Second)
	for time.Since(since) < 300*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("the link never filled up")
		}
		time.Sleep(20 * time.Millisecond)
		if n := written.Load(); n != last {
			last, since = n, time.Now()
		}
	}
	return proxy, client, &written, func() {
		server.Close()
		client.Close()
		proxy.Stop()
		upstream.Close()
	}
}

// within runs f and fails the test if it has not returned after d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %s: the control API is wedged", what, d)
	}
}

// readPattern reads n bytes from c and checks them against the pattern.
func readPattern(t *testing.T, c net.Conn, n uint64) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64*1024)
	var got uint64
	for got < n {
		k, err := c.Read(buf)
		for i := 0; i < k; i++ {
			if buf[i] != patternByte(got+uint64(i)) {
				t.Fatalf("byte %d is wrong: a chunk was lost, repeated or reordered", got+uint64(i))
			}
		}
		got += uint64(k)
		if err != nil && err != io.EOF {
			t.Fatalf("read after %d of %d bytes: %v", got, n, err)
		}
		if err == io.EOF {
			break
		}
	}
	if got < n {
		t.Fatalf("read %d of the %d bytes the upstream wrote before the toxic changes", got, n)
	}
}

func TestToxicChangesDoNotWaitForABlockedWriter(t *testing.T) {
	cases := []struct {
		name     string
		existing []string // toxics in place before the link fills up
		add      string
		remove   string
	}{
		{"add and remove on a noop chain", nil,
			`{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":1}}`, "lat"},
		{"remove a latency that is blocked", []string{
			`{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":1}}`},
			`{"name":"bw","type":"bandwidth","stream":"downstream","attributes":{"rate":100000}}`, "lat"},
		{"add behind a slicer that is blocked", []string{
			`{"name":"sl","type":"slicer","stream":"downstream","attributes":{"average_size":64,"size_variation":0,"delay":0}}`},
			`{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":1}}`, "sl"},
		{"remove a bandwidth that is blocked", []string{
			`{"name":"bw","type":"bandwidth","stream":"downstream","attributes":{"rate":100000}}`},
			`{"name":"lat","type":"latency","stream":"downstream","attributes":{"latency":1}}`, "bw"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			proxy, client, written, stop := startBlockedLink(t, tc.existing...)
			defer stop()
			collection := proxy.Toxics
			within(t, 3*time.Second, "adding a toxic", func() {
				if _, err := collection.AddToxicJson(strings.NewReader(tc.add)); err != nil {
					t.Error(err)
				}
			})
			within(t, 3*time.Second, "removing a toxic", func() {
				if err := collection.RemoveToxic(context.Background(), tc.remove); err != nil {
					t.Error(err)
				}
			})
			within(t, 3*time.Second, "resetting the toxics", func() {
				collection.ResetToxics(context.Background())
			})
			// Nothing the upstream wrote before the changes was lost or reordered.
			readPattern(t, client, written.Load())
		})
	}
}
