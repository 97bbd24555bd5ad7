//! Read-by-handle benchmarks over a log of 1,000,000 records (built once with
//! `SyncPolicy::OsBuffered`, then synced), against redb holding the same frame bodies keyed
//! by position, in one criterion group so the ratios come from one run:
//!
//! - `record_log/record`: the whole record, checksum checked and decoded;
//! - `record_log/read_output_256`: 256 bytes of a tool result's content at an offset;
//! - `redb/get`: one read transaction, one `get`, the value copied out.
//!
//! And `open_1m`, opening that log: `record_log_open_checkpointed` (`RecordLog::open` with
//! the checkpoint an earlier open wrote: the frames it covers are not read again),
//! `record_log_open_full` (every frame's checksums verified, the index rebuilt: the open of
//! before the checkpoint, measured through `open_read_only` with no checkpoint file so that
//! it writes none), and `read_and_crc32c`, a plain read of the same file with one CRC-32C
//! over all of it: the floor for any open that checks every byte. Beside them,
//! `checkpoint_read_and_crc32c`: the same plain read and CRC-32C of the checkpoint file
//! alone (its compact index, 16 bytes a frame), the floor for any open that trusts a
//! checkpoint only after checking its checksum.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{
    Record, RecordHandle, RecordSource, RunId, ToolCallId, ToolOutput, ToolResult, UserMessage,
};
use redb::{Database, Durability, ReadableDatabase, TableDefinition};

const TABLE: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("records");
const RECORDS: u64 = 1_000_000;

fn record(seq: u64) -> Record {
    if seq.is_multiple_of(2) {
        Record::User(UserMessage {
            text: format!("user message number {seq}, asking for something"),
        })
    } else {
        let text: String = (0..600)
            .map(|i| char::from(b'a' + ((seq as usize + i) % 26) as u8))
            .collect();
        Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new(format!("call_{seq}")).unwrap(),
            name: "read_file".into(),
            output: ToolOutput::text(text),
        })
    }
}

/// Pseudo-random positions (xorshift), the same in every run.
struct Picks(u64);

impl Picks {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

fn read_by_handle(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let run = RunId::new("bench").unwrap();
    let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    let db = Database::create(dir.path().join("bench.redb")).unwrap();
    let mut seq = 0;
    while seq < RECORDS {
        let chunk: Vec<Record> = (seq..(seq + 10_000).min(RECORDS)).map(record).collect();
        log.append_batch(&chunk).unwrap();
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(Durability::None).unwrap();
        {
            let mut table = txn.open_table(TABLE).unwrap();
            for (i, record) in chunk.iter().enumerate() {
                // The record as serde JSON: about the size of its frame body in the log.
                let bytes = serde_json::to_vec(record).unwrap();
                table.insert(seq + i as u64, bytes.as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
        seq += chunk.len() as u64;
    }
    log.sync().unwrap();
    let txn = db.begin_write().unwrap();
    txn.commit().unwrap(); // Immediate: makes the whole load durable
    drop(log);
    // Reopen, as a reader would: the index is rebuilt by the scan.
    let started = std::time::Instant::now();
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    eprintln!(
        "opened {} records ({} MB) in {:?}",
        recovery.records,
        log.size_bytes() / 1_000_000,
        started.elapsed()
    );
    assert_eq!(log.len(), RECORDS);

    let mut group = c.benchmark_group("read_by_handle_1m");
    let mut picks = Picks(0x9E37_79B9_7F4A_7C15);
    group.bench_function("record_log/record", |b| {
        b.iter(|| {
            let handle = RecordHandle::new(run.clone(), picks.next(RECORDS));
            black_box(log.record(&handle).unwrap())
        });
    });
    let mut buf = [0u8; 256];
    group.bench_function("record_log/read_output_256", |b| {
        b.iter(|| {
            let handle = RecordHandle::new(run.clone(), picks.next(RECORDS / 2) * 2 + 1);
            black_box(log.read_output(&handle, 300, &mut buf).unwrap())
        });
    });
    group.bench_function("redb/get", |b| {
        b.iter(|| {
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(TABLE).unwrap();
            let value = table.get(picks.next(RECORDS)).unwrap().unwrap();
            black_box(value.value().to_vec())
        });
    });
    group.bench_function("redb/get_decoded", |b| {
        b.iter(|| {
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(TABLE).unwrap();
            let value = table.get(picks.next(RECORDS)).unwrap().unwrap();
            black_box(serde_json::from_slice::<Record>(value.value()).unwrap())
        });
    });
    group.finish();
    drop(log);

    let path = RecordLog::path_for(dir.path(), &run);
    let mut group = c.benchmark_group("open_1m");
    group.sample_size(10);
    let mut checkpoint = path.clone().into_os_string();
    checkpoint.push(".ckpt");
    let _ = std::fs::remove_file(&checkpoint);
    group.bench_function("record_log_open_full", |b| {
        b.iter(|| RecordLog::open_read_only(dir.path(), &run).unwrap());
    });
    // This open verifies every frame and writes the checkpoint the next ones use.
    drop(RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap());
    assert!(std::path::Path::new(&checkpoint).exists());
    group.bench_function("record_log_open_checkpointed", |b| {
        b.iter(|| RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap());
    });
    group.bench_function("read_and_crc32c", |b| {
        b.iter(|| read_and_crc32c(path.as_ref()));
    });
    eprintln!(
        "checkpoint: {} bytes",
        std::fs::metadata(&checkpoint).unwrap().len()
    );
    group.bench_function("checkpoint_read_and_crc32c", |b| {
        b.iter(|| read_and_crc32c(checkpoint.as_ref()));
    });
    group.finish();
}

/// One plain read of the file at `path` in 1 MiB pieces, with one CRC-32C over all of it.
fn read_and_crc32c(path: &std::path::Path) -> u32 {
    let mut file = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0u32;
    loop {
        let n = std::io::Read::read(&mut file, &mut buf).unwrap();
        if n == 0 {
            break crc;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
}

criterion_group!(benches, read_by_handle);
criterion_main!(benches);
