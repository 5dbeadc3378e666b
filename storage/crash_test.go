//go:build linux

package storage_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/syncgate/syncgate/storage"
)

// crashChildEnv carries the DB path to the crash test's child process.
const crashChildEnv = "SYNCGATE_STORAGE_CRASH_CHILD"

const (
	crashProducers = 20
	crashStream    = "crash"
)

// TestCrash kills a child process that appends with 20 idempotent
// producers (SIGKILL at random moments, at least 20 times), restarting it
// each time, then checks that every acknowledged append is in the log at
// its acknowledged offset with its content, that no (producer, seq) was
// written twice, that offsets increase and that bbolt's consistency check
// passes. A SIGKILL keeps the page cache, so this tests the commit
// protocol and the producer retry path, not power loss.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test skipped in -short mode")
	}
	path := filepath.Join(t.TempDir(), "crash.db")
	type key struct {
		p   int
		seq int64
	}
	acked := map[key]string{}
	var mu sync.Mutex
	dups := 0
	start := time.Now()
	kills := 0
	for kills < 25 && time.Since(start) < 25*time.Second {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var p int
				var seq int64
				var off string
				var dup bool
				switch line := sc.Text(); {
				case strings.HasPrefix(line, "ERR "), strings.HasPrefix(line, "--- FAIL"):
					// The child's own failure: an append that erred.
					t.Errorf("child: %s", line)
					continue
				case !strings.HasPrefix(line, "ACK "):
					continue // go test's own lines
				}
				if _, err := fmt.Sscanf(sc.Text(), "ACK %d %d %s %t", &p, &seq, &off, &dup); err != nil {
					t.Errorf("bad line %q: %v", sc.Text(), err)
					continue
				}
				mu.Lock()
				if prev, ok := acked[key{p, seq}]; ok && prev != off {
					t.Errorf("p%02d seq %d acked at %s and at %s", p, seq, prev, off)
				}
				acked[key{p, seq}] = off
				if dup {
					dups++
				}
				mu.Unlock()
			}
		}()
		// The moment of the crash is the point of the test.
		time.Sleep(time.Duration(20+rand.IntN(180)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
		// Killed, not ended by itself: a child that stopped early (it
		// could not open the DB, say) would leave nothing to check.
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("child ended by itself before the kill: %v", err)
		}
		kills++
	}
	if kills < 20 {
		t.Fatalf("only %d kills", kills)
	}

	db, err := storage.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.BoltForTest().View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("bbolt check: %v", err)
	}
	at := map[string]string{}
	seen := map[string]bool{}
	next := map[string]int64{}
	prev := ""
	after := storage.ZeroOffset
	for {
		res, err := db.Read(context.Background(), crashStream, after, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Records {
			if r.Offset <= prev {
				t.Fatalf("offset %s after %s", r.Offset, prev)
			}
			prev = r.Offset
			s := string(r.Data)
			if seen[s] {
				t.Fatalf("%s written twice", s)
			}
			seen[s] = true
			at[r.Offset] = s
			var p int
			var seq int64
			fmt.Sscanf(s, "p%02d:%d", &p, &seq)
			id := fmt.Sprintf("p%02d", p)
			if seq != next[id] {
				t.Fatalf("%s: seq %d after %d", id, seq, next[id]-1)
			}
			next[id]++
		}
		if res.UpToDate {
			break
		}
		after = res.Next
	}
	for k, off := range acked {
		if want := fmt.Sprintf("p%02d:%d", k.p, k.seq); at[off] != want {
			t.Fatalf("acked %s at %s, log has %q there", want, off, at[off])
		}
	}
	if len(acked) < 200 {
		t.Fatalf("only %d acknowledged appends", len(acked))
	}
	if dups == 0 {
		// Each restart resumes a few seqs back: some must be answered as
		// duplicates, or the retry path went untested.
		t.Fatal("no append was acknowledged as a duplicate on retry")
	}
	t.Logf("%d kills, %d acked appends (%d acked as duplicates on retry), %d records in %v", kills, len(acked), dups, len(seen), time.Since(start).Round(time.Millisecond))
}

// TestCrashChild is TestCrash's child process; it does nothing unless run
// by TestCrash. Each producer resumes a few seqs before its last one in
// the log, so it retries appends that may or may not have been
// acknowledged, and prints every acknowledgement at once.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("run by TestCrash")
	}
	db, err := storage.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, _, err := db.Create(ctx, crashStream, storage.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	last := map[int]int64{}
	after := storage.ZeroOffset
	for {
		res, err := db.Read(ctx, crashStream, after, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Records {
			var p int
			var seq int64
			fmt.Sscanf(string(r.Data), "p%02d:%d", &p, &seq)
			last[p] = seq
		}
		if res.UpToDate {
			break
		}
		after = res.Next
	}
	var mu sync.Mutex
	begin := time.Now()
	var wg sync.WaitGroup
	for p := range crashProducers {
		wg.Go(func() {
			seq := int64(0)
			if l, ok := last[p]; ok {
				seq = max(0, l-3)
			}
			for ; time.Since(begin) < 10*time.Second; seq++ {
				r, err := db.Append(ctx, crashStream, storage.AppendRequest{
					Records:  [][]byte{fmt.Appendf(nil, "p%02d:%d", p, seq)},
					Producer: &storage.Producer{ID: fmt.Sprintf("p%02d", p), Seq: seq},
				})
				if err != nil {
					mu.Lock()
					fmt.Fprintf(os.Stdout, "ERR p%02d seq %d: %v\n", p, seq, err)
					mu.Unlock()
					return
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "ACK %d %d %s %t\n", p, seq, r.Offset, r.Duplicate)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}
