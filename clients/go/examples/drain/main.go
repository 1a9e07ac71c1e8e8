// Command drain leases one partition through a kafka-lease gateway, reads a number of its
// records as fast as the gateway sends them, and releases the lease. It is the benchmark's
// Go client arm, and a measure of what a Go consumer gets from a gateway.
//
// While it reads it prints `progress <records>` twice a second; at the end one line
// `result <json>`: the records and value bytes read, the seconds from just before the
// Acquire to the first record and to the last, the records and value bytes of the first
// response, and the CPU seconds (user and system) the process spent over that time.
//
//	drain -addr 127.0.0.1:50051 -group bench -topic events -partition 0 -records 100000
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	kafkalease "github.com/kafka-lease/kafka-lease/clients/go"
)

type result struct {
	Records           int64   `json:"records"`
	Bytes             int64   `json:"bytes"`
	FirstRecordSecs   float64 `json:"first_record_secs"`
	FinishSecs        float64 `json:"finish_secs"`
	FirstBatchRecords int64   `json:"first_batch_records"`
	FirstBatchBytes   int64   `json:"first_batch_bytes"`
	CPUSecs           float64 `json:"cpu_secs"`
}

func main() {
	addr := flag.String("addr", "", "the gateway, host:port (required)")
	group := flag.String("group", "", "the consumer group (required)")
	topic := flag.String("topic", "", "the topic (required)")
	partition := flag.Int("partition", 0, "the partition to lease")
	records := flag.Int64("records", 0, "how many records to read (required, > 0)")
	maxRecords := flag.Uint("max-records", 10000, "most records per response (1 ..= 10000)")
	maxBytes := flag.Uint("max-bytes", 4<<20, "most bytes per response (at most 4 MiB)")
	maxWait := flag.Duration("max-wait", 10*time.Millisecond, "how long the gateway may wait to fill a response")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after this long")
	flag.Parse()
	if *addr == "" || *group == "" || *topic == "" || *records <= 0 {
		fmt.Fprintln(os.Stderr, "drain: -addr, -group, -topic and -records (> 0) are required")
		flag.Usage()
		os.Exit(2)
	}
	opts := kafkalease.ReadOptions{MaxRecords: uint32(*maxRecords), MaxBytes: uint32(*maxBytes), MaxWait: maxWait}
	out, err := run(*addr, *group, *topic, int32(*partition), *records, opts, *timeout)
	if err != nil {
		log.Fatalf("drain: %v", err)
	}
	line, err := json.Marshal(out)
	if err != nil {
		log.Fatalf("drain: %v", err)
	}
	fmt.Printf("result %s\n", line)
}

// cpuSeconds is the CPU time (user and system, every thread) the process has used so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatalf("drain: getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func run(addr, group, topic string, partition int32, want int64, opts kafkalease.ReadOptions, timeout time.Duration) (result, error) {
	var out result
	client, err := kafkalease.NewClient(addr)
	if err != nil {
		return out, err
	}
	defer func() { _ = client.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	var done atomic.Int64
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				fmt.Printf("progress %d\n", done.Load())
			}
		}
	}()
	defer func() {
		close(stop)
		<-stopped
	}()

	cpu0 := cpuSeconds()
	t0 := time.Now()
	lease, err := client.Acquire(ctx, group, topic, kafkalease.AcquireOptions{
		Partition: kafkalease.Ptr(partition),
		Member:    "drain",
		TTL:       time.Minute,
	})
	if err != nil {
		return out, fmt.Errorf("acquire %s/%d for %s: %w", topic, partition, group, err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	for batch, err := range lease.Batches(ctx, opts) {
		if err != nil {
			return out, fmt.Errorf("read %s/%d after %d records: %w", topic, partition, out.Records, err)
		}
		var bytes int64
		for _, r := range batch.Records {
			bytes += int64(len(r.Value))
		}
		if out.Records == 0 {
			out.FirstRecordSecs = time.Since(t0).Seconds()
			out.FirstBatchRecords, out.FirstBatchBytes = int64(len(batch.Records)), bytes
		}
		out.Records += int64(len(batch.Records))
		out.Bytes += bytes
		done.Store(out.Records)
		if out.Records >= want {
			break
		}
	}
	out.FinishSecs = time.Since(t0).Seconds()
	out.CPUSecs = cpuSeconds() - cpu0
	if out.Records < want {
		return out, fmt.Errorf("the Read of %s/%d ended after %d of %d records", topic, partition, out.Records, want)
	}
	return out, nil
}
