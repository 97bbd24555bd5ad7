//! Issue 31's record figures: the record log (a file, every append synced with
//! `fdatasync`) and PostgreSQL (`$PSYCH_TEST_PG`, durable commits), side by side in one
//! group per case, both through the same seam (psych-types' `RecordStore`): a durable
//! append of one 4 KiB tool result, a batch of 64 such results (one `fdatasync`, one
//! transaction), a read by handle of one, and a 16 KiB page at the end of a 256 MiB
//! result. Run with
//! `cargo bench -p psych-tests --bench record_stores -- --warm-up-time 1 --measurement-time 5`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "a benchmark fails loudly on bad data"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use psych_record_log::{SharedRecordLog, SyncPolicy};
use psych_store_conformance::pg::{database, psql};
use psych_store_postgres::{PgBlocking, PgRecords};
use psych_types::{
    Record, RecordHandle, RecordSource, RecordStore, RunId, ToolCallId, ToolOutput, ToolResult,
};

/// A tool result whose text is `len` bytes of lines.
fn result(len: usize) -> Record {
    let line = "2026-12-05T01:00:00Z INFO request served in 12 ms, status 200\n";
    let mut text = line.repeat(len / line.len() + 1);
    text.truncate(len);
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new("call").unwrap(),
        name: "read_logs".into(),
        output: ToolOutput::text(text),
    })
}

/// A PostgreSQL store in schema `bench_records`, emptied first.
fn postgres() -> PgBlocking {
    psql("drop schema if exists bench_records cascade");
    PgBlocking::open(&format!("{}?schema=bench_records", database())).unwrap()
}

/// The two stores of Run `run`: the record log in `dir` (every append synced), and
/// PostgreSQL.
fn stores(dir: &tempfile::TempDir, pg: &PgBlocking, run: &str) -> (SharedRecordLog, PgRecords) {
    let run = RunId::new(run).unwrap();
    let file = SharedRecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend)
        .unwrap()
        .0;
    (file, pg.records("bench", &run).unwrap())
}

fn append<S: RecordStore>(store: &S, records: &[Record]) {
    let handles = store.append_batch(records).unwrap();
    black_box(handles);
}

fn read_page<S: RecordStore>(store: &S, handle: &RecordHandle, at: u64, page: &mut [u8]) {
    let mut done = 0;
    while done < page.len() {
        let n = store
            .read_output(handle, at + done as u64, &mut page[done..])
            .unwrap();
        assert!(n > 0);
        done += n;
    }
    black_box(page);
}

fn record_stores(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let pg = postgres();

    let one = vec![result(4096)];
    let (file, postgres) = stores(&dir, &pg, "append-one");
    let mut group = c.benchmark_group("append_4k");
    group.bench_function("record_log", |b| b.iter(|| append(&file, &one)));
    group.bench_function("postgres", |b| b.iter(|| append(&postgres, &one)));
    group.finish();

    let batch: Vec<Record> = (0..64).map(|_| result(4096)).collect();
    let (file, postgres) = stores(&dir, &pg, "append-batch");
    let mut group = c.benchmark_group("append_batch_64x4k");
    group.bench_function("record_log", |b| b.iter(|| append(&file, &batch)));
    group.bench_function("postgres", |b| b.iter(|| append(&postgres, &batch)));
    group.finish();

    let (file, postgres) = stores(&dir, &pg, "read");
    let handles = (
        file.append(&one[0]).unwrap(),
        postgres.append(&one[0]).unwrap(),
    );
    let mut group = c.benchmark_group("read_by_handle_4k");
    group.bench_function("record_log", |b| {
        b.iter(|| black_box(file.record(&handles.0).unwrap()))
    });
    group.bench_function("postgres", |b| {
        b.iter(|| black_box(postgres.record(&handles.1).unwrap()))
    });
    group.finish();

    let huge = result(256 << 20);
    let (file, postgres) = stores(&dir, &pg, "huge");
    let handles = (file.append(&huge).unwrap(), postgres.append(&huge).unwrap());
    drop(huge);
    let at = (256 << 20) - 16 * 1024;
    let mut page = vec![0; 16 * 1024];
    let mut group = c.benchmark_group("page_at_end_of_256mib");
    group.bench_function("record_log", |b| {
        b.iter(|| read_page(&file, &handles.0, at, &mut page))
    });
    group.bench_function("postgres", |b| {
        b.iter(|| read_page(&postgres, &handles.1, at, &mut page))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = record_stores
}
criterion_main!(benches);
