//! Append benchmarks, each comparison in one criterion group so the ratios come from one run:
//!
//! - `durable_append_4k`: a durable 4 KiB tool result (`SyncPolicy::EveryAppend`) against a
//!   bare `write` + `fdatasync` of the same 4 KiB appended to a plain file, and against redb
//!   (one write transaction per record, `Durability::Immediate`, the default). Before it,
//!   the first two are also timed alternately and the medians printed (see `interleaved`).
//!   Beside them, what the high-water mark costs on its own, side by side: a 4 KiB
//!   `pwrite` into a preallocated file + `fdatasync` (`prealloc_write_fdatasync`, the
//!   log's own pattern without the mark) against the same plus a 36-byte `pwrite` into
//!   the file's first page before the sync (`prealloc_write_mark_fdatasync`, what each
//!   durable append did for its mark until the end mark replaced it); and the same 4 KiB
//!   followed by a 24-byte end mark in the same `pwrite`, each write starting over the
//!   previous mark (`prealloc_write_end_mark_fdatasync`, what each durable append does
//!   now). Each is also timed alternately against the write without a mark, and the log's
//!   own durable append against that write too; medians and ratios printed.
//! - `large_append_2m`: a durable 2 MiB tool result against a bare `write` + `fdatasync` of
//!   the same 2 MiB appended to a plain file.
//! - `group_commit_64`: at 512 B and 4 KiB records, 64 records appended one after another
//!   with one `fdatasync` each (`per_append_fsync`), against the same 64 in one
//!   `append_batch` (one write, one `fdatasync`), and against 64 threads each appending one
//!   record at once to a `SharedRecordLog` under `SyncPolicy::GroupCommit` (max 64 records,
//!   5 ms): the leader/follower group commit, thread wake-ups included
//!   (`shared_64_threads`). Throughput in records; the shared case prints how many groups
//!   its rounds took. `threads_only_no_append` is the same 64-thread barrier round with no
//!   append: the harness's own cost, to read `shared_64_threads` against. Beside them, the
//!   disk's own floor for one group: the same 64 records' readable bytes (64 × 512 B or
//!   64 × 4 KiB, without frame headers or metadata) as one `pwrite` + `fdatasync` into a
//!   preallocated, synced file (`floor_write_fdatasync`); the same with the 24-byte end
//!   mark in the same `pwrite` (`floor_write_end_mark_fdatasync`); and the same into a file
//!   that grows as the log's does, by the log's rule (after a write of up to 128 KiB,
//!   zeros up to 1 MiB past the end whenever under 512 KiB is left; a larger write grows
//!   the file itself) and, when it grew, the 36-byte header mark into the first page,
//!   before the sync (`floor_growing_fdatasync`): the log's I/O without
//!   the log. Before each size, all six are also timed alternately and the medians and
//!   ratios printed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use psych_record_log::{GroupCommit, RecordLog, SharedRecordLog, SyncPolicy};
use psych_types::{Record, RunId, ToolCallId, ToolOutput, ToolResult};
use redb::{Database, TableDefinition};

const TABLE: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("records");

fn tool_result(len: usize) -> Record {
    let text: String = (0..len)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new("call_1").unwrap(),
        name: "read_file".into(),
        output: ToolOutput::text(text),
    })
}

/// A scratch directory. It must be on a real disk for the fsync figures to mean anything
/// (on these machines `/tmp` is ext4 on the same disk as the checkout, not tmpfs).
fn bench_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// The readable bytes of a [`tool_result`] record: what the bare writes append.
fn readable(record: &Record) -> Vec<u8> {
    let Record::ToolResult(result) = record else {
        unreachable!()
    };
    psych_types::readable_bytes(&result.output).into_owned()
}

/// Times `bytes` appended to a plain file in `dir` with `write` + `fdatasync`, as
/// `bare_write_fdatasync`; returns the file.
fn bare_write_fdatasync(
    group: &mut BenchmarkGroup<'_, WallTime>,
    dir: &Path,
    bytes: &[u8],
) -> File {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("bare"))
        .unwrap();
    group.bench_function("bare_write_fdatasync", |b| {
        b.iter(|| {
            file.write_all(black_box(bytes)).unwrap();
            file.sync_data().unwrap();
        });
    });
    file
}

fn large_append(c: &mut Criterion) {
    let mut group = c.benchmark_group("large_append_2m");
    group.sample_size(20);
    let record = tool_result(2 << 20);
    let bytes = readable(&record);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    let dir = bench_dir();
    bare_write_fdatasync(&mut group, dir.path(), &bytes);
    let run = RunId::new("bench").unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    group.bench_function("record_log_append", |b| {
        b.iter(|| log.append(black_box(&record)).unwrap());
    });
    group.finish();
}

fn durable_append(c: &mut Criterion) {
    let mut group = c.benchmark_group("durable_append_4k");
    let record = tool_result(4096);
    let bytes = readable(&record);
    group.throughput(Throughput::Bytes(bytes.len() as u64));

    let dir = bench_dir();
    let mut file = bare_write_fdatasync(&mut group, dir.path(), &bytes);

    let run = RunId::new("bench").unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    interleaved(&mut file, &bytes, &mut log, &record);
    group.bench_function("record_log_append", |b| {
        b.iter(|| log.append(black_box(&record)).unwrap());
    });

    mark_cost(&mut group, dir.path(), &bytes, &mut log, &record);

    let db = Database::create(dir.path().join("bench.redb")).unwrap();
    let mut key = 0u64;
    group.bench_function("redb_insert_commit", |b| {
        b.iter(|| {
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(TABLE).unwrap();
                table.insert(key, black_box(&*bytes)).unwrap();
            }
            txn.commit().unwrap();
            key += 1;
        });
    });
    group.finish();
}

/// The disk's flush latency here drifts by 10x within seconds as other work comes and goes,
/// so criterion's back-to-back measurements can mislead. This times the two alternately,
/// one bare append then one log append, 300 times, and prints both medians and the ratio.
fn interleaved(file: &mut std::fs::File, bytes: &[u8], log: &mut RecordLog, record: &Record) {
    let (bare, ours) = alternate_medians(
        || {
            file.write_all(bytes).unwrap();
            file.sync_data().unwrap();
        },
        || {
            log.append(record).unwrap();
        },
    );
    eprintln!(
        "interleaved medians: bare write+fdatasync {bare:?}, record_log_append {ours:?}, \
         ratio {:.2}",
        ours.as_secs_f64() / bare.as_secs_f64()
    );
}

/// Times `first` and `second` alternately, 300 times each, and returns their medians.
fn alternate_medians(mut first: impl FnMut(), mut second: impl FnMut()) -> (Duration, Duration) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        let started = Instant::now();
        first();
        a.push(started.elapsed());
        let started = Instant::now();
        second();
        b.push(started.elapsed());
    }
    a.sort();
    b.sort();
    (a[150], b[150])
}

/// Bytes of zeros written ahead into each file of [`mark_cost`], as the log preallocates.
const PREALLOCATED: u64 = 16 << 20;

/// A new, empty file at `path` (truncated if it was there), open for reading and writing.
fn empty_file(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// A file of [`PREALLOCATED`] zeros, written and synced, and the writes into it: each
/// `write` puts `bytes` at the next offset (back to the start past the end), with
/// [`Mark::Header`] a 36-byte write at offset 21 (where a log of Run `bench` keeps its
/// high-water mark's first slot) before the `fdatasync`, with [`Mark::End`] 24 bytes more
/// in the same `pwrite`, right after `bytes` (the next write starts over them).
struct Preallocated {
    file: File,
    at: u64,
}

impl Preallocated {
    fn create(path: &Path) -> Self {
        let file = empty_file(path);
        let zeros = vec![0u8; 1 << 20];
        for i in 0..PREALLOCATED >> 20 {
            file.write_all_at(&zeros, i << 20).unwrap();
        }
        file.sync_all().unwrap();
        Self { file, at: 4096 }
    }

    fn write(&mut self, bytes: &[u8], mark: Mark) {
        if self.at + bytes.len() as u64 + 24 > PREALLOCATED {
            self.at = 4096;
        }
        match mark {
            Mark::End => {
                // As the log gathers frames and end mark into one buffer.
                let mut buf = Vec::with_capacity(bytes.len() + 24);
                buf.extend_from_slice(bytes);
                buf.extend_from_slice(&[7u8; 24]);
                self.file.write_all_at(black_box(&buf), self.at).unwrap();
            }
            Mark::None | Mark::Header => {
                self.file.write_all_at(black_box(bytes), self.at).unwrap();
            }
        }
        self.at += bytes.len() as u64;
        if mark == Mark::Header {
            self.file.write_all_at(black_box(&[7u8; 36]), 21).unwrap();
        }
        self.file.sync_data().unwrap();
    }
}

/// Which mark a [`Preallocated`] write carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// None: the log's pattern without a mark.
    None,
    /// The 36-byte high-water mark in the first page, as every durable append wrote it
    /// before the end mark.
    Header,
    /// The 24-byte end mark after the frame, in the same `pwrite`, as now.
    End,
}

/// The high-water mark's own cost, side by side: the same 4 KiB `pwrite` + `fdatasync`
/// into preallocated space, without and with the 36-byte mark write into the first page
/// (so each sync flushes two places instead of one). Timed alternately first (medians
/// printed), then as two criterion functions.
fn mark_cost(
    group: &mut BenchmarkGroup<'_, WallTime>,
    dir: &Path,
    bytes: &[u8],
    log: &mut RecordLog,
    record: &Record,
) {
    let mut plain = Preallocated::create(&dir.join("prealloc_plain"));
    let mut marked = Preallocated::create(&dir.join("prealloc_mark"));
    let mut ended = Preallocated::create(&dir.join("prealloc_end_mark"));
    let (without, with) = alternate_medians(
        || plain.write(bytes, Mark::None),
        || marked.write(bytes, Mark::Header),
    );
    eprintln!(
        "interleaved medians: prealloc write+fdatasync {without:?}, with the header mark's \
         write {with:?}, ratio {:.2}",
        with.as_secs_f64() / without.as_secs_f64()
    );
    let (without, with) = alternate_medians(
        || plain.write(bytes, Mark::None),
        || ended.write(bytes, Mark::End),
    );
    eprintln!(
        "interleaved medians: prealloc write+fdatasync {without:?}, with the end mark in the \
         same write {with:?}, ratio {:.2}",
        with.as_secs_f64() / without.as_secs_f64()
    );
    let (without, ours) = alternate_medians(
        || plain.write(bytes, Mark::None),
        || {
            log.append(record).unwrap();
        },
    );
    eprintln!(
        "interleaved medians: prealloc write+fdatasync {without:?}, record_log_append \
         {ours:?}, ratio {:.2}",
        ours.as_secs_f64() / without.as_secs_f64()
    );
    group.bench_function("prealloc_write_fdatasync", |b| {
        b.iter(|| plain.write(bytes, Mark::None));
    });
    group.bench_function("prealloc_write_mark_fdatasync", |b| {
        b.iter(|| marked.write(bytes, Mark::Header));
    });
    group.bench_function("prealloc_write_end_mark_fdatasync", |b| {
        b.iter(|| ended.write(bytes, Mark::End));
    });
}

/// Zeros the log writes ahead of its last frame (`write.rs`, `PREALLOC`): whenever fewer
/// than half of them are left after a write, it writes zeros up to this far past its end.
const LOG_PREALLOC: u64 = 1 << 20;
/// The largest write after which the log preallocates (`write.rs`, `PREALLOC_MAX_WRITE`);
/// a larger one grows the file itself.
const LOG_PREALLOC_MAX_WRITE: u64 = 128 << 10;

/// A file written as the log writes its frames, without the log: each `write` puts `bytes`
/// and a 24-byte end mark at the end (the next write starts over the mark), then, as the
/// log's preallocation does, after a write of up to [`LOG_PREALLOC_MAX_WRITE`], zeros up
/// to [`LOG_PREALLOC`] past the end when fewer than half of that are left; when the file
/// grew (zeros, or a larger write past the end), the 36-byte header mark at offset 21 (the
/// log writes it only with a sync that commits a new length); then `fdatasync`. The file
/// grows from 0, as a new log does.
struct Growing {
    file: File,
    end: u64,
    allocated: u64,
}

impl Growing {
    fn create(path: &Path) -> Self {
        let file = empty_file(path);
        file.write_all_at(&[0u8; 93], 0).unwrap();
        file.sync_all().unwrap();
        Self {
            file,
            end: 93,
            allocated: 93,
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut buf = Vec::with_capacity(bytes.len() + 24);
        buf.extend_from_slice(bytes);
        buf.extend_from_slice(&[7u8; 24]);
        self.file.write_all_at(black_box(&buf), self.end).unwrap();
        self.end += bytes.len() as u64;
        let before = self.allocated;
        self.allocated = self.allocated.max(self.end + 24);
        if bytes.len() as u64 <= LOG_PREALLOC_MAX_WRITE
            && self.allocated - self.end < LOG_PREALLOC / 2
        {
            let zeros = vec![0u8; (self.end + LOG_PREALLOC - self.allocated) as usize];
            self.file.write_all_at(&zeros, self.allocated).unwrap();
            self.allocated = self.end + LOG_PREALLOC;
        }
        if self.allocated != before {
            self.file.write_all_at(black_box(&[7u8; 36]), 21).unwrap();
        }
        self.file.sync_data().unwrap();
    }
}

/// The disk's floor for one group of `bytes`, three ways (see the module doc): into
/// preallocated space without and with the end mark, and growing as the log grows.
struct Floors {
    bytes: Vec<u8>,
    bare: Preallocated,
    ended: Preallocated,
    growing: Growing,
}

impl Floors {
    fn create(dir: &Path, bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            bare: Preallocated::create(&dir.join("floor_bare")),
            ended: Preallocated::create(&dir.join("floor_end_mark")),
            growing: Growing::create(&dir.join("floor_growing")),
        }
    }
}

/// 64 appender threads parked on a barrier, each appending one record per round to a
/// shared log (or, with no log, doing nothing: the harness's own cost): one round is 64
/// tool calls finishing at once.
struct Appenders {
    start: Arc<Barrier>,
    finish: Arc<Barrier>,
}

impl Appenders {
    fn spawn(log: Option<&Arc<SharedRecordLog>>, record: &Record, threads: usize) -> Self {
        let start = Arc::new(Barrier::new(threads + 1));
        let finish = Arc::new(Barrier::new(threads + 1));
        for _ in 0..threads {
            let (log, record) = (log.cloned(), record.clone());
            let (start, finish) = (Arc::clone(&start), Arc::clone(&finish));
            std::thread::spawn(move || {
                loop {
                    start.wait();
                    if let Some(log) = &log {
                        black_box(log.append(&record).unwrap());
                    }
                    finish.wait();
                }
            });
        }
        Self { start, finish }
    }

    /// One round: every thread appends once; returns when all are acknowledged.
    fn round(&self) {
        self.start.wait();
        self.finish.wait();
    }
}

/// As [`interleaved`], for group commit: 25 rounds, each one of 64 appends with a sync
/// each, one `append_batch` of 64, and one 64-thread shared round, back to back, so a drift
/// of the disk's flush latency hits all three alike. Prints the medians and ratios.
fn interleaved_group(
    len: usize,
    single: &mut RecordLog,
    batched: &mut RecordLog,
    appenders: &Appenders,
    batch: &[Record],
    floors: &mut Floors,
) {
    let mut times = [(); 6].map(|()| Vec::new());
    for _ in 0..25 {
        let started = Instant::now();
        floors.bare.write(&floors.bytes, Mark::None);
        times[3].push(started.elapsed());
        let started = Instant::now();
        floors.ended.write(&floors.bytes, Mark::End);
        times[4].push(started.elapsed());
        let started = Instant::now();
        floors.growing.write(&floors.bytes);
        times[5].push(started.elapsed());
        let started = Instant::now();
        for record in batch {
            single.append(record).unwrap();
        }
        times[0].push(started.elapsed());
        let started = Instant::now();
        batched.append_batch(batch).unwrap();
        times[1].push(started.elapsed());
        let started = Instant::now();
        appenders.round();
        times[2].push(started.elapsed());
    }
    let [single, batch, shared, floor, floor_end_mark, growing] = times.map(|mut t| {
        t.sort();
        t[12]
    });
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    eprintln!(
        "interleaved medians at {len} B: per_append_fsync {single:?}, append_batch {batch:?} \
         ({:.1}x), shared_64_threads {shared:?} ({:.1}x); floor {floor:?} ({:.1}x; \
         append_batch {:.2}x the floor), with the end mark {floor_end_mark:?}, growing as the log \
         {growing:?}",
        ratio(single, batch),
        ratio(single, shared),
        ratio(single, floor),
        ratio(batch, floor),
    );
}

fn group_commit(c: &mut Criterion) {
    const RECORDS: usize = 64;
    let mut group = c.benchmark_group("group_commit_64");
    group.throughput(Throughput::Elements(RECORDS as u64));
    // 64 fsyncs an iteration: few, long samples.
    group.sample_size(10);
    let run = RunId::new("bench").unwrap();
    let policy = SyncPolicy::GroupCommit(
        GroupCommit::builder()
            .max_wait(Duration::from_millis(5))
            .max_records(RECORDS)
            .max_bytes(64 << 20)
            .build()
            .unwrap(),
    );
    for len in [512usize, 4096] {
        let record = tool_result(len);
        let batch: Vec<Record> = (0..RECORDS).map(|_| record.clone()).collect();

        let dirs = [bench_dir(), bench_dir(), bench_dir()];
        let (mut single, _) =
            RecordLog::open(dirs[0].path(), &run, SyncPolicy::EveryAppend).unwrap();
        let (mut batched, _) =
            RecordLog::open(dirs[1].path(), &run, SyncPolicy::EveryAppend).unwrap();
        let (log, _) = SharedRecordLog::open(dirs[2].path(), &run, policy).unwrap();
        let log = Arc::new(log);
        let appenders = Appenders::spawn(Some(&log), &record, RECORDS);
        let floor_dir = bench_dir();
        let mut floors = Floors::create(floor_dir.path(), readable(&record).repeat(RECORDS));
        interleaved_group(
            len,
            &mut single,
            &mut batched,
            &appenders,
            &batch,
            &mut floors,
        );

        group.bench_with_input(
            BenchmarkId::new("per_append_fsync", len),
            &batch,
            |b, batch| {
                b.iter(|| {
                    for record in batch {
                        single.append(record).unwrap();
                    }
                });
            },
        );
        group.bench_with_input(BenchmarkId::new("append_batch", len), &batch, |b, batch| {
            b.iter(|| batched.append_batch(batch).unwrap());
        });
        let before = log.stats();
        group.bench_function(BenchmarkId::new("shared_64_threads", len), |b| {
            b.iter(|| appenders.round());
        });
        let after = log.stats();
        eprintln!(
            "shared_64_threads/{len}: {} records in {} groups (largest {})",
            after.records - before.records,
            after.groups - before.groups,
            after.largest_group
        );
        let Floors {
            bytes,
            bare,
            ended,
            growing,
        } = &mut floors;
        group.bench_function(BenchmarkId::new("floor_write_fdatasync", len), |b| {
            b.iter(|| bare.write(bytes, Mark::None));
        });
        group.bench_function(
            BenchmarkId::new("floor_write_end_mark_fdatasync", len),
            |b| {
                b.iter(|| ended.write(bytes, Mark::End));
            },
        );
        group.bench_function(BenchmarkId::new("floor_growing_fdatasync", len), |b| {
            b.iter(|| growing.write(bytes))
        });
    }
    // The barrier rounds alone: what waking 64 threads and waiting for them costs here.
    let idle = Appenders::spawn(None, &tool_result(0), RECORDS);
    group.bench_function("threads_only_no_append", |b| b.iter(|| idle.round()));
    group.finish();
}

criterion_group!(benches, durable_append, large_append, group_commit);
criterion_main!(benches);
