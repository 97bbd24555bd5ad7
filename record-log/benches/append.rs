//! Append benchmarks, each comparison in one criterion group so the ratios come from one run:
//!
//! - `durable_append_4k`: a durable 4 KiB tool result (`SyncPolicy::EveryAppend`) against a
//!   bare `write` + `fdatasync` of the same 4 KiB appended to a plain file, and against redb
//!   (one write transaction per record, `Durability::Immediate`, the default). Before it,
//!   the first two are also timed alternately and the medians printed (see `interleaved`).
//! - `group_commit_64`: 64 records appended one `fsync` each against one `append_batch`
//!   (one write, one `fdatasync`), at 4 KiB and 512 B records; throughput in records.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{Record, RunId, ToolCallId, ToolOutput, ToolResult};
use redb::{Database, TableDefinition};

const TABLE: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("records");

fn tool_result(len: usize) -> Record {
    let text: String = (0..len)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    Record::ToolResult(ToolResult {
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

fn durable_append(c: &mut Criterion) {
    let mut group = c.benchmark_group("durable_append_4k");
    let record = tool_result(4096);
    let Record::ToolResult(result) = &record else {
        unreachable!()
    };
    let bytes = psych_types::readable_bytes(&result.output);
    group.throughput(Throughput::Bytes(bytes.len() as u64));

    let dir = bench_dir();
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.path().join("bare"))
        .unwrap();
    group.bench_function("bare_write_fdatasync", |b| {
        b.iter(|| {
            file.write_all(black_box(&bytes)).unwrap();
            file.sync_data().unwrap();
        });
    });

    let run = RunId::new("bench").unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    interleaved(&mut file, &bytes, &mut log, &record);
    group.bench_function("record_log_append", |b| {
        b.iter(|| log.append(black_box(&record)).unwrap());
    });

    let db = Database::create(dir.path().join("bench.redb")).unwrap();
    let mut key = 0u64;
    group.bench_function("redb_insert_commit", |b| {
        b.iter(|| {
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(TABLE).unwrap();
                table.insert(key, black_box(bytes.as_slice())).unwrap();
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
    let (mut bare, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        let started = Instant::now();
        file.write_all(bytes).unwrap();
        file.sync_data().unwrap();
        bare.push(started.elapsed());
        let started = Instant::now();
        log.append(record).unwrap();
        ours.push(started.elapsed());
    }
    bare.sort();
    ours.sort();
    let (bare, ours) = (bare[150], ours[150]);
    eprintln!(
        "interleaved medians: bare write+fdatasync {bare:?}, record_log_append {ours:?}, \
         ratio {:.2}",
        ours.as_secs_f64() / bare.as_secs_f64()
    );
}

fn group_commit(c: &mut Criterion) {
    let mut group = c.benchmark_group("group_commit_64");
    group.throughput(Throughput::Elements(64));
    let dir = bench_dir();
    let run = RunId::new("bench").unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    for len in [4096usize, 512] {
        let batch: Vec<Record> = (0..64).map(|_| tool_result(len)).collect();
        group.bench_with_input(
            BenchmarkId::new("per_append_fsync", len),
            &batch,
            |b, batch| {
                b.iter(|| {
                    for record in batch {
                        log.append(record).unwrap();
                    }
                });
            },
        );
        group.bench_with_input(BenchmarkId::new("append_batch", len), &batch, |b, batch| {
            b.iter(|| log.append_batch(batch).unwrap());
        });
    }
    group.finish();
}

criterion_group!(benches, durable_append, group_commit);
criterion_main!(benches);
