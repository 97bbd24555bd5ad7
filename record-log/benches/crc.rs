//! CRC-32C throughput on 64 MiB, in one criterion group so the ratios come from one run:
//! `slicing_by_8` (the table-driven code the log used before, kept here as the baseline),
//! the `crc32c` crate (which the log now uses) and the `crc-fast` crate. All three must give
//! the same value, checked before timing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

/// Eight 256-entry tables: `TABLES[k][b]` is the CRC of byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 8] = make_tables();

const fn make_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][i] = crc;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev >> 8) ^ tables[0][(prev & 0xFF) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
}

/// The log's former CRC-32C: slicing by eight.
fn slicing_by_8(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        crc = TABLES[7][(lo & 0xFF) as usize]
            ^ TABLES[6][((lo >> 8) & 0xFF) as usize]
            ^ TABLES[5][((lo >> 16) & 0xFF) as usize]
            ^ TABLES[4][(lo >> 24) as usize]
            ^ TABLES[3][usize::from(chunk[4])]
            ^ TABLES[2][usize::from(chunk[5])]
            ^ TABLES[1][usize::from(chunk[6])]
            ^ TABLES[0][usize::from(chunk[7])];
    }
    for &byte in chunks.remainder() {
        crc = (crc >> 8) ^ TABLES[0][((crc ^ u32::from(byte)) & 0xFF) as usize];
    }
    !crc
}

fn crc_fast(bytes: &[u8]) -> u32 {
    // CRC-32 values fit in the low 32 bits of crc-fast's u64.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

fn crc(c: &mut Criterion) {
    const LEN: usize = 64 << 20;
    // Not all one byte value: a simple generator, so every table entry is exercised.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let data: Vec<u8> = (0..LEN)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let expected = slicing_by_8(&data);
    assert_eq!(crc32c::crc32c(&data), expected);
    assert_eq!(crc_fast(&data), expected);
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc_fast(b"123456789"), 0xE306_9283);

    let mut group = c.benchmark_group("crc32c_64mib");
    group.throughput(Throughput::Bytes(LEN as u64));
    group.sample_size(10);
    group.bench_function("slicing_by_8", |b| {
        b.iter(|| slicing_by_8(black_box(&data)));
    });
    group.bench_function("crc32c_crate", |b| {
        b.iter(|| crc32c::crc32c(black_box(&data)));
    });
    group.bench_function("crc_fast_crate", |b| b.iter(|| crc_fast(black_box(&data))));
    group.finish();
}

criterion_group!(benches, crc);
criterion_main!(benches);
