//! Benchmarks of per-turn resolution and of the call-time guard, each beside its floor.
//!
//! - `resolve_20_servers_5000_tools`: 20 servers of 250 tools each, built from the fixture
//!   catalogues (renamed copies), every tool granted, `Auto` preload, default settings.
//!   - `resolve`: [`resolve`] into a Surface (narrowing, costs, shapes, cap, names);
//!   - `baseline_serialize_schemas`: serializing every input schema once to JSON text, the
//!     least work that looks at every schema the way the cost estimate must.
//! - `resolve_cached_20_servers_5000_tools`: the same setup through a [`SurfaceCache`].
//!   - `cached_unchanged`: nothing changed since the last call;
//!   - `baseline_serialize_schemas`: as above.
//! - `one_server_changed`: one server of the same setup changes its catalogue (one tool
//!   fewer, a new version) between calls.
//!   - `cache`: [`SurfaceCache::resolve`] after that change (the other 19 servers reused);
//!   - `alone`: [`resolve`] of a setup with that server alone, the floor the cache aims at.
//! - `guard_one_call`: one direct call to notion's `API-post-page` (`$defs`, `$ref`,
//!   `oneOf`) with valid arguments and a warm [`Validators`] cache.
//!   - `guard`: [`Surface::guard`] (name lookup, narrowing now, reachability, validation);
//!   - `baseline_jsonschema_is_valid`: the compiled `jsonschema` validator alone on the
//!     same arguments.
//! - `guard_beside_a_16_mib_guard`: the same warm call guarded while another thread guards
//!   calls of the same tool with 16 MiB arguments (a passed result's size) back to back,
//!   sharing the call's Surface and cache, as two sessions of one identity share them in
//!   `psych serve`.
//!   - `shared_cache`: as [`Validators`] is shared now, locked only to look a schema up;
//!   - `baseline_lock_across_the_guard`: the old way, one lock held across each guard, as
//!     the runtime's executor held its `Mutex<Validators>` (the lock is not fair, so an
//!     iteration may wait for several large guards).
//! - `search_1000_tools`, `search_10000_tools`: the fixtures' tools renamed, 250 a server.
//!   - `query_built_index`: one query through the index a Surface keeps;
//!   - `build_index_once`: that index's build;
//!   - `baseline_build_per_query`: the old way, an index built for every query;
//!   - `plain_bm25_query`: the plain BM25 the ranking's quality is measured against
//!     (`tests/search_eval.rs`), over name and description, as written there.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad data"
)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Sets its flag when dropped: a background thread looping until the flag is set stops
/// even when the benchmark beside it panics (else its scope would wait forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

use common::{Bytes4, FIXTURES, Setup, fixture_setup, fixture_tools, named_setup};
use criterion::{Criterion, criterion_group, criterion_main};
use psych_disclosure::{
    SearchIndex, Settings, Surface, SurfaceCache, Validators, Verdict, resolve,
};
use psych_types::{Preload, ToolName};
use serde_json::{Value, json};

/// 20 servers × 250 tools from the fixtures.
fn large() -> Setup {
    let pool: Vec<_> = FIXTURES
        .iter()
        .flat_map(|(_, file)| fixture_tools(file))
        .collect();
    let mut setup = named_setup(
        (0..20).map(|i| (format!("server-{i:02}"), FIXTURES[0].1)),
        Preload::Auto,
    );
    for (i, catalog) in setup.catalogs.iter_mut().enumerate() {
        let mut tools: Vec<_> = (0..250)
            .map(|j| {
                let mut tool = pool[(i * 250 + j) % pool.len()].clone();
                tool.name = ToolName::new(format!("t{j:03}_{}", tool.name)).unwrap();
                tool
            })
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        catalog.tools = tools.into();
    }
    setup
}

fn bench_resolve(c: &mut Criterion) {
    let setup = large();
    let settings = Settings::default();
    let tools: usize = setup.catalogs.iter().map(|c| c.tools.len()).sum();
    assert_eq!(tools, 5_000);
    let mut group = c.benchmark_group("resolve_20_servers_5000_tools");
    group.bench_function("resolve", |b| {
        b.iter(|| resolve(black_box(&setup.inputs()), &settings, &Bytes4).unwrap())
    });
    group.bench_function("baseline_serialize_schemas", |b| {
        b.iter(|| {
            let mut bytes = 0;
            for catalog in black_box(&setup.catalogs) {
                for tool in catalog.tools.iter() {
                    bytes += serde_json::to_string(&tool.input_schema).unwrap().len();
                }
            }
            bytes
        })
    });
    group.finish();
}

fn bench_guard(c: &mut Criterion) {
    let setup = fixture_setup(Preload::Eager);
    let settings = Settings::builder()
        .direct_max_tools(1_000)
        .direct_max_tokens(u64::MAX)
        .tool_cap(1_000)
        .build()
        .unwrap();
    let surface: Surface = setup.resolve(&settings);
    let args = json!({
        "parent": {"page_id": "59833787-2cf9-4fdf-8782-e53db20768a5"},
        "properties": {"title": "Minutes"},
        "children": [{"type": "paragraph"}]
    });
    let live = setup.live();
    let validators = Validators::new();
    let name = "notion__API-post-page";
    assert!(matches!(
        surface.guard(name, &args, &live, &validators),
        Verdict::Forward(_)
    ));
    let schema = setup.catalogs[1]
        .tools
        .iter()
        .find(|t| t.name.as_str() == "API-post-page")
        .map(|t| Value::Object(t.input_schema.clone()))
        .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    assert!(validator.is_valid(&args));

    let mut group = c.benchmark_group("guard_one_call");
    group.bench_function("guard", |b| {
        b.iter(|| surface.guard(black_box(name), black_box(&args), &live, &validators))
    });
    group.bench_function("baseline_jsonschema_is_valid", |b| {
        b.iter(|| validator.is_valid(black_box(&args)))
    });
    group.finish();

    let mut large = args.clone();
    large["properties"]["title"] = Value::String("x".repeat(16 << 20));
    assert!(matches!(
        surface.guard(name, &large, &live, &validators),
        Verdict::Forward(_)
    ));
    let held = Mutex::new(());
    let mut group = c.benchmark_group("guard_beside_a_16_mib_guard");
    group.sample_size(20);
    for (label, across) in [
        ("shared_cache", false),
        ("baseline_lock_across_the_guard", true),
    ] {
        let stop = AtomicBool::new(false);
        let guard = |arguments: &Value| {
            let _held = across.then(|| held.lock().unwrap());
            surface.guard(name, arguments, &live, &validators)
        };
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    black_box(guard(&large));
                }
            });
            let _stop = StopOnDrop(&stop);
            group.bench_function(label, |b| b.iter(|| guard(black_box(&args))));
        });
    }
    group.finish();
}

/// The cache on an unchanged setup, beside the least work that looks at every schema.
fn bench_cache(c: &mut Criterion) {
    let setup = large();
    let settings = Settings::default();
    let mut group = c.benchmark_group("resolve_cached_20_servers_5000_tools");
    group.bench_function("baseline_serialize_schemas", |b| {
        b.iter(|| {
            let mut bytes = 0;
            for catalog in black_box(&setup.catalogs) {
                for tool in catalog.tools.iter() {
                    bytes += serde_json::to_string(&tool.input_schema).unwrap().len();
                }
            }
            bytes
        })
    });
    let mut cache = SurfaceCache::new(Bytes4);
    cache.resolve(&setup.inputs(), &settings).unwrap();
    group.bench_function("cached_unchanged", |b| {
        b.iter(|| {
            cache
                .resolve(black_box(&setup.inputs()), &settings)
                .unwrap()
        })
    });
    group.finish();
}

/// The cache after one server's catalogue changed, beside that one server resolved alone:
/// the issue asks the first to cost at most 1.2 times the second.
fn bench_one_server_changed(c: &mut Criterion) {
    let settings = Settings::default();
    let mut group = c.benchmark_group("one_server_changed");
    // One server's catalogue alternates between two versions (each its own allocation), so
    // every iteration resolves after a change of that server.
    let mut changed = large();
    let mut versions = [changed.catalogs[7].clone(), changed.catalogs[7].clone()];
    let mut tools = versions[1].tools.to_vec();
    tools.pop();
    versions[1].tools = tools.into();
    versions[1].version = psych_types::CatalogVersion(2);
    let mut cache = SurfaceCache::new(Bytes4);
    cache.resolve(&changed.inputs(), &settings).unwrap();
    let mut turn = 0usize;
    group.bench_function("cache", |b| {
        b.iter(|| {
            turn += 1;
            changed.catalogs[7] = versions[turn % 2].clone();
            cache
                .resolve(black_box(&changed.inputs()), &settings)
                .unwrap()
        })
    });
    let alone = Setup {
        connections: vec![changed.connections[7].clone()],
        catalogs: vec![changed.catalogs[7].clone()],
        grant: changed.grant.clone(),
    };
    // The cache's answer is resolve's (the property tests check it); here, once more.
    assert_eq!(
        *cache.resolve(&changed.inputs(), &settings).unwrap(),
        resolve(&changed.inputs(), &settings, &Bytes4).unwrap()
    );
    group.bench_function("alone", |b| {
        b.iter(|| resolve(black_box(&alone.inputs()), &settings, &Bytes4).unwrap())
    });
    group.finish();
}

/// Search over `n` tools (the fixtures' tools renamed, one server of 250 per 250): a query
/// through the index a Surface keeps, its one-off build, the old way (an index built for
/// every query), and the plain BM25 the ranking's quality is measured against.
fn bench_search(c: &mut Criterion) {
    let pool: Vec<_> = FIXTURES
        .iter()
        .flat_map(|(_, file)| fixture_tools(file))
        .collect();
    for n in [1_000usize, 10_000] {
        let servers: Vec<_> = (0..n / 250)
            .map(|i| psych_types::ServerId::new(format!("server-{i:02}")).unwrap())
            .collect();
        let tools: Vec<_> = (0..n)
            .map(|j| {
                let mut tool = pool[j % pool.len()].clone();
                tool.name = ToolName::new(format!("t{j:05}_{}", tool.name)).unwrap();
                (&servers[j / 250], tool)
            })
            .collect();
        let query = "create a pull request on a branch";
        let index = SearchIndex::new(tools.iter().map(|(s, t)| (*s, t)));
        let mut group = c.benchmark_group(format!("search_{n}_tools"));
        group.bench_function("query_built_index", |b| {
            b.iter(|| index.search(black_box(query), 10))
        });
        group.bench_function("build_index_once", |b| {
            b.iter(|| SearchIndex::new(tools.iter().map(|(s, t)| (*s, t))))
        });
        group.bench_function("baseline_build_per_query", |b| {
            b.iter(|| {
                SearchIndex::new(tools.iter().map(|(s, t)| (*s, t))).search(black_box(query), 10)
            })
        });
        // The quality baseline of `tests/search_eval.rs`: plain BM25 over name and
        // description, as written there (a scan of every tool, all hits sorted).
        let owned: Vec<_> = tools
            .iter()
            .map(|(s, t)| ((*s).clone(), t.clone()))
            .collect();
        let plain = common::bm25::Bm25::over(&owned, common::bm25::name_and_description);
        group.bench_function("plain_bm25_query", |b| {
            b.iter(|| plain.search(black_box(query)))
        });
        group.finish();
    }
}

criterion_group!(
    benches,
    bench_resolve,
    bench_guard,
    bench_cache,
    bench_one_server_changed,
    bench_search
);
criterion_main!(benches);
