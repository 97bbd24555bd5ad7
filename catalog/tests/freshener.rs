//! The freshener's four triggers with a scripted lister under tokio's paused clock: sync on
//! connect, the TTL sweep and its jitter, a hanging server beside a healthy one, a storm of
//! `list_changed`, the in-flight race, failures with backoff, and a clean shutdown.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use psych_catalog::{Catalog, Freshener, FreshenerConfig, RefreshError, RefreshOutcome};
use psych_types::{CatalogVersion, ServerId, ToolDefinition, ToolLister};
use tokio::time::{Instant, sleep};

/// What one `tools/list` call of the script does.
#[derive(Clone)]
enum Step {
    Reply(Duration, Vec<ToolDefinition>),
    Fail(Duration, &'static str),
    Hang,
}

#[derive(Debug)]
struct ScriptError(&'static str);

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ScriptError {}

/// A lister that plays a script per server (the last step repeats), and records when each
/// call started, in seconds since the test began.
struct Scripted {
    start: Instant,
    script: Mutex<BTreeMap<ServerId, VecDeque<Step>>>,
    calls: Mutex<Vec<(ServerId, f64)>>,
    /// Listing futures alive now (created and not yet dropped).
    alive: Arc<AtomicUsize>,
}

struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Scripted {
    fn new(script: impl IntoIterator<Item = (&'static str, Vec<Step>)>) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            script: Mutex::new(
                script
                    .into_iter()
                    .map(|(s, steps)| (server(s), steps.into()))
                    .collect(),
            ),
            calls: Mutex::new(Vec::new()),
            alive: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// When each call to `server` started, in seconds (to the millisecond).
    fn calls(&self, name: &str) -> Vec<f64> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _)| s.as_str() == name)
            .map(|(_, t)| *t)
            .collect()
    }
}

impl ToolLister for Scripted {
    type Error = ScriptError;

    fn list_tools(
        &self,
        server: &ServerId,
    ) -> impl Future<Output = Result<Vec<ToolDefinition>, ScriptError>> + Send {
        let at = (self.start.elapsed().as_millis() as f64) / 1000.0;
        self.calls.lock().unwrap().push((server.clone(), at));
        let step = {
            let mut script = self.script.lock().unwrap();
            let steps = script.get_mut(server).expect("a scripted server");
            if steps.len() > 1 {
                steps.pop_front().unwrap()
            } else {
                steps[0].clone()
            }
        };
        self.alive.fetch_add(1, Ordering::SeqCst);
        let alive = Alive(Arc::clone(&self.alive));
        async move {
            let _alive = alive;
            match step {
                Step::Reply(after, tools) => {
                    sleep(after).await;
                    Ok(tools)
                }
                Step::Fail(after, why) => {
                    sleep(after).await;
                    Err(ScriptError(why))
                }
                Step::Hang => std::future::pending().await,
            }
        }
    }
}

fn server(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

/// An in-memory catalogue whose clock is tokio's (paused) clock.
fn catalog() -> Catalog {
    let start = Instant::now();
    Catalog::builder()
        .clock(move || u64::try_from(start.elapsed().as_millis()).unwrap())
        .in_memory()
        .unwrap()
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn config() -> psych_catalog::FreshenerBuilder {
    FreshenerConfig::builder()
        .ttl(secs(60.0))
        .jitter(Duration::ZERO)
        .list_timeout(secs(5.0))
        .backoff(secs(1.0), secs(4.0))
        .debounce(secs(0.2), secs(2.0))
        .seed(7)
}

fn tools(file: &str) -> Vec<ToolDefinition> {
    common::catalogue(file)
}

#[tokio::test(start_paused = true)]
async fn sync_on_connect_then_the_ttl_sweep_with_jitter() {
    let names = ["a", "b", "c", "d"];
    let lister = Scripted::new(names.map(|n| {
        (
            n,
            vec![Step::Reply(
                Duration::ZERO,
                tools("server-memory.tools.json"),
            )],
        )
    }));
    let config = config().jitter(secs(10.0)).build().unwrap();
    let freshener = Freshener::start(catalog(), Arc::clone(&lister), config).unwrap();
    for n in names {
        freshener.connect(&server(n));
    }
    sleep(secs(200.0)).await;
    let mut first_sweeps = Vec::new();
    for n in names {
        let calls = lister.calls(n);
        assert_eq!(calls[0], 0.0, "{n}: listed on connect");
        assert!(calls.len() >= 3, "{n}: {calls:?}");
        for pair in calls.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                (60.0..70.0).contains(&gap),
                "{n}: TTL 60 s + jitter < 10 s, got {gap} in {calls:?}"
            );
        }
        first_sweeps.push(calls[1]);
        let live = freshener.catalog().live(&server(n)).unwrap();
        assert_eq!(live.tools.len(), 9);
    }
    first_sweeps.sort_by(f64::total_cmp);
    first_sweeps.dedup();
    assert_eq!(
        first_sweeps.len(),
        4,
        "jitter spreads the servers: {first_sweeps:?}"
    );
    freshener.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_hanging_server_never_delays_the_others() {
    let memory = tools("server-memory.tools.json");
    let lister = Scripted::new([
        ("ok", vec![Step::Reply(secs(0.5), memory.clone())]),
        (
            "hang",
            vec![Step::Reply(Duration::ZERO, memory.clone()), Step::Hang],
        ),
    ]);
    let freshener =
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap();
    freshener.connect(&server("ok"));
    freshener.connect(&server("hang"));
    sleep(secs(190.0)).await;
    // The healthy server keeps its rhythm: listed at 0, then 60 s after each sync ends.
    assert_eq!(lister.calls("ok"), [0.0, 60.5, 121.0, 181.5]);
    // The hanging one: a 5 s timeout each time, then backoff 1, 2, 4, 4… seconds.
    assert_eq!(
        lister.calls("hang"),
        [
            0.0, 60.0, 66.0, 73.0, 82.0, 91.0, 100.0, 109.0, 118.0, 127.0, 136.0, 145.0, 154.0,
            163.0, 172.0, 181.0
        ]
    );
    let live = freshener.catalog().live(&server("hang")).unwrap();
    assert_eq!(live.tools.len(), 9, "a hanging server keeps its tools");
    let error = live.health.last_error.expect("the timeout is recorded");
    assert_eq!(error.message, "tools/list on hang did not answer within 5s");
    assert!(
        freshener
            .catalog()
            .live(&server("ok"))
            .unwrap()
            .health
            .last_error
            .is_none()
    );
    freshener.shutdown().await;
    assert_eq!(
        lister.alive.load(Ordering::SeqCst),
        0,
        "no listing left running"
    );
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_list_changed_coalesces() {
    let lister = Scripted::new([(
        "s",
        vec![Step::Reply(secs(0.1), tools("playwright.tools.json"))],
    )]);
    let freshener =
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap();
    let s = server("s");
    freshener.connect(&s);
    sleep(secs(1.0)).await;
    assert_eq!(lister.calls("s"), [0.0]);

    // 1,000 at once: one refresh, once they have been quiet for 0.2 s.
    for _ in 0..1_000 {
        freshener.list_changed(&s);
    }
    sleep(secs(5.0)).await;
    assert_eq!(lister.calls("s"), [0.0, 1.2]);

    // 1,000 over one second (one per millisecond): still one, 0.2 s after the last.
    for _ in 0..1_000 {
        freshener.list_changed(&s);
        sleep(secs(0.001)).await;
    }
    sleep(secs(5.0)).await;
    assert_eq!(lister.calls("s"), [0.0, 1.2, 7.199]);

    // 1,000 over three seconds (from 12 s to 15 s): the longest wait (2 s) forces one at
    // 14 s, and the quiet after the last notification gives the second.
    for _ in 0..1_000 {
        freshener.list_changed(&s);
        sleep(secs(0.003)).await;
    }
    sleep(secs(5.0)).await;
    assert_eq!(lister.calls("s"), [0.0, 1.2, 7.199, 14.0, 15.197]);
    freshener.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_older_reply_arriving_last_never_overwrites_a_newer_one() {
    let old = tools("server-memory.tools.json");
    let new = tools("server-filesystem.tools.json");
    let lister = Scripted::new([(
        "s",
        vec![
            // The first listing is slow and answers with what the server had then…
            Step::Reply(secs(10.0), old.clone()),
            // …the second, started after list_changed, answers first with the new tools.
            Step::Reply(secs(1.0), new.clone()),
            Step::Hang,
        ],
    )]);
    let freshener =
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap();
    let s = server("s");
    let slow = freshener.refresh(&s);
    let notify = async {
        sleep(secs(0.5)).await;
        freshener.list_changed(&s);
        sleep(secs(5.0)).await;
        let live = freshener.catalog().live(&s).unwrap();
        assert_eq!(live.tools.len(), 14, "the newer reply is stored at 1.7 s");
        live.version
    };
    let (slow, newer_version) = tokio::join!(slow, notify);
    assert_eq!(lister.calls("s"), [0.0, 0.7]);
    assert_eq!(
        slow.unwrap(),
        RefreshOutcome::Superseded {
            version: newer_version
        }
    );
    let live = freshener.catalog().live(&s).unwrap();
    assert_eq!(live.tools.len(), 14, "the older reply lost");
    assert_eq!(live.version, CatalogVersion(1), "and wrote nothing");
    freshener.shutdown().await;
}

/// A listing asked for by `list_changed` that fails while an older one is in flight: the
/// older one, stored after it, may hold the tools from before the change, so the newer is
/// retried with the backoff, not left to the TTL sweep.
#[tokio::test(start_paused = true)]
async fn a_failed_newer_listing_is_retried_though_an_older_one_stored_after_it() {
    let old = tools("server-memory.tools.json");
    let new = tools("server-filesystem.tools.json");
    let lister = Scripted::new([(
        "s",
        vec![
            // The first listing is slow, and answers with what the server had before…
            Step::Reply(secs(4.0), old.clone()),
            // …the one list_changed asked for fails at once (the server reloading)…
            Step::Fail(Duration::ZERO, "reloading"),
            // …and the retry gets the new tools.
            Step::Reply(Duration::ZERO, new.clone()),
            Step::Hang,
        ],
    )]);
    let freshener =
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap();
    let s = server("s");
    let slow = freshener.refresh(&s);
    let notify = async {
        sleep(secs(0.5)).await;
        freshener.list_changed(&s);
    };
    let (slow, ()) = tokio::join!(slow, notify);
    assert!(matches!(slow.unwrap(), RefreshOutcome::Stored(_)));
    sleep(secs(5.0)).await;
    // The retry 1 s after the older listing was stored (before: the TTL sweep at 64 s).
    assert_eq!(lister.calls("s"), [0.0, 0.7, 5.0]);
    let live = freshener.catalog().live(&s).unwrap();
    assert_eq!(live.tools.len(), 14, "the new tools");
    assert!(live.health.last_error.is_none());
    freshener.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn two_on_demand_refreshes_race_and_the_later_one_wins() {
    let lister = Scripted::new([(
        "s",
        vec![
            Step::Reply(secs(3.0), tools("server-memory.tools.json")),
            Step::Reply(secs(1.0), tools("playwright.tools.json")),
            Step::Hang,
        ],
    )]);
    let freshener =
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap();
    let s = server("s");
    let (first, second) = tokio::join!(freshener.refresh(&s), async {
        sleep(secs(0.1)).await;
        freshener.refresh(&s).await
    });
    let second = second.unwrap();
    let RefreshOutcome::Stored(stored) = &second else {
        panic!("the later call stores: {second:?}")
    };
    assert_eq!(stored.diff.added.len(), 25);
    assert_eq!(
        first.unwrap(),
        RefreshOutcome::Superseded {
            version: stored.version
        }
    );
    assert_eq!(freshener.catalog().live(&s).unwrap().tools.len(), 25);
    freshener.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn failures_keep_the_tools_and_retry_with_backoff() {
    let old = tools("server-memory.tools.json");
    let new = tools("server-filesystem.tools.json");
    let lister = Scripted::new([(
        "s",
        vec![
            Step::Reply(Duration::ZERO, old.clone()),
            Step::Fail(Duration::ZERO, "connection reset"),
            Step::Fail(Duration::ZERO, "connection reset"),
            Step::Fail(Duration::ZERO, "connection reset"),
            Step::Fail(Duration::ZERO, "connection reset"),
            Step::Fail(Duration::ZERO, "connection reset"),
            Step::Reply(Duration::ZERO, new.clone()),
        ],
    )]);
    let freshener =
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap();
    let s = server("s");
    let first = freshener.refresh(&s).await.unwrap();
    assert_eq!(first.version(), CatalogVersion(1));
    sleep(secs(62.0)).await;
    // The on-demand caller learns the error…
    let err = freshener.refresh(&s).await.unwrap_err();
    assert!(matches!(err, RefreshError::Lister { .. }), "{err}");
    assert_eq!(err.to_string(), "tools/list on s failed: connection reset");
    // …and the server keeps its tools, with the error in its health.
    let live = freshener.catalog().live(&s).unwrap();
    assert_eq!(*live.tools, {
        let mut old = old.clone();
        old.sort_by(|a, b| a.name.cmp(&b.name));
        old
    });
    assert_eq!(
        live.health.last_error.unwrap().message,
        "tools/list on s failed: connection reset"
    );
    sleep(secs(30.0)).await;
    // The TTL sweep fails at 60, the retry 1 s later fails, the demand at 62 is the third
    // failure; then retries after 4 s (2 doubled twice, capped at 4) and 4 s; the sixth
    // listing succeeds.
    assert_eq!(lister.calls("s"), [0.0, 60.0, 61.0, 62.0, 66.0, 70.0, 74.0]);
    let live = freshener.catalog().live(&s).unwrap();
    assert_eq!(live.tools.len(), 14);
    assert_eq!(live.version, CatalogVersion(2));
    assert!(live.health.last_error.is_none());
    freshener.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_sweep_resumes_from_the_stored_sync() {
    let catalog = catalog();
    let s = server("s");
    catalog
        .refresh(&s, &tools("server-memory.tools.json"))
        .unwrap();
    sleep(secs(45.0)).await;
    let lister = Scripted::new([(
        "s",
        vec![Step::Reply(
            Duration::ZERO,
            tools("server-memory.tools.json"),
        )],
    )]);
    let freshener =
        Freshener::start(catalog, Arc::clone(&lister), config().build().unwrap()).unwrap();
    // The MCP adapter reports a notification before anything else happens.
    freshener.list_changed(&s);
    sleep(secs(1.0)).await;
    assert_eq!(lister.calls("s"), [0.2]);
    // Not listed again until 60 s after that sync.
    sleep(secs(70.0)).await;
    assert_eq!(lister.calls("s"), [0.2, 60.2]);
    freshener.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_task_and_answers_every_waiter() {
    let lister = Scripted::new([("a", vec![Step::Hang]), ("b", vec![Step::Hang])]);
    let freshener = Arc::new(
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap(),
    );
    freshener.connect(&server("a"));
    let waiting = {
        let freshener = Arc::clone(&freshener);
        tokio::spawn(async move { freshener.refresh(&server("b")).await })
    };
    sleep(secs(1.0)).await;
    assert_eq!(lister.alive.load(Ordering::SeqCst), 2);
    freshener.shutdown().await;
    assert_eq!(
        lister.alive.load(Ordering::SeqCst),
        0,
        "every listing dropped"
    );
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, RefreshError::ShutDown { .. }), "{err}");
    // After shutdown nothing starts.
    freshener.connect(&server("a"));
    freshener.list_changed(&server("b"));
    assert!(matches!(
        freshener.refresh(&server("a")).await,
        Err(RefreshError::ShutDown { .. })
    ));
    sleep(secs(100.0)).await;
    assert_eq!(lister.calls("a").len(), 1);
    assert_eq!(lister.calls("b").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_disconnected_server_is_no_longer_swept() {
    let memory = tools("server-memory.tools.json");
    let lister = Scripted::new([
        (
            "gone",
            vec![Step::Reply(Duration::ZERO, memory.clone()), Step::Hang],
        ),
        ("stays", vec![Step::Reply(Duration::ZERO, memory.clone())]),
    ]);
    let freshener =
        Freshener::start(catalog(), Arc::clone(&lister), config().build().unwrap()).unwrap();
    freshener.connect(&server("gone"));
    freshener.connect(&server("stays"));
    sleep(secs(61.0)).await;
    assert_eq!(lister.alive.load(Ordering::SeqCst), 1, "gone's sweep hangs");
    freshener.disconnect(&server("gone"));
    sleep(secs(300.0)).await;
    assert_eq!(lister.calls("gone"), [0.0, 60.0], "no retry, no sweep");
    assert_eq!(
        lister.alive.load(Ordering::SeqCst),
        0,
        "its listing was dropped"
    );
    assert_eq!(
        lister.calls("stays"),
        [0.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0]
    );
    // Its tools stay in the catalogue, and a reconnect lists it again.
    assert_eq!(
        freshener
            .catalog()
            .live(&server("gone"))
            .unwrap()
            .tools
            .len(),
        9
    );
    freshener.connect(&server("gone"));
    sleep(secs(1.0)).await;
    assert_eq!(lister.calls("gone"), [0.0, 60.0, 361.0]);
    freshener.shutdown().await;
}

/// A catalogue shared with other processes, as the freshener sees it: the in-memory
/// catalogue behind the store seam, whose refresh lease answers as scripted (another
/// process listing the server, or having stored a listing after the request).
#[derive(Debug)]
struct Leased {
    inner: Catalog,
    answers: Mutex<VecDeque<&'static str>>,
    asked: AtomicUsize,
    /// Held by every guard a `Proceed` hands out: its count says how many are alive.
    held: Arc<()>,
}

impl psych_types::CatalogStore for Leased {
    type Error = psych_catalog::CatalogError;

    fn failure(&self, error: &Self::Error) -> psych_types::CatalogFailure {
        psych_types::CatalogStore::failure(&self.inner, error)
    }
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn refresh(
        &self,
        server: &ServerId,
        tools: &[ToolDefinition],
    ) -> Result<psych_types::Refresh, Self::Error> {
        self.inner.refresh(server, tools)
    }
    fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), Self::Error> {
        self.inner.record_failure(server, message)
    }
    fn version(&self) -> Result<CatalogVersion, Self::Error> {
        self.inner.version()
    }
    fn live(&self, server: &ServerId) -> Result<psych_types::ServerCatalog, Self::Error> {
        self.inner.live(server)
    }
    fn servers(&self) -> Result<Vec<ServerId>, Self::Error> {
        self.inner.servers()
    }
    fn health(&self, server: &ServerId) -> Result<psych_types::ServerHealth, Self::Error> {
        self.inner.health(server)
    }
    fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, Self::Error> {
        self.inner.tools_at(server, version)
    }
    fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<psych_types::Diff, Self::Error> {
        self.inner.diff(server, from, to)
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn lease(&self, _: &ServerId, _: u64) -> Result<psych_types::Lease, Self::Error> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Ok(match self.answers.lock().unwrap().pop_front() {
            Some("busy") => psych_types::Lease::Busy,
            Some("satisfied") => psych_types::Lease::Satisfied(CatalogVersion(7)),
            _ => psych_types::Lease::Proceed(psych_types::LeaseGuard::holding(Arc::clone(
                &self.held,
            ))),
        })
    }
}

fn leased(answers: &[&'static str]) -> (Catalog, Arc<Leased>) {
    let store = Arc::new(Leased {
        inner: catalog(),
        answers: Mutex::new(answers.iter().copied().collect()),
        asked: AtomicUsize::new(0),
        held: Arc::new(()),
    });
    let erased: Arc<psych_types::DynCatalogStore> =
        Arc::new(psych_types::Erased(Arc::clone(&store)));
    (Catalog::shared(erased), store)
}

#[tokio::test(start_paused = true)]
async fn on_a_shared_catalogue_a_server_is_listed_once_its_lease_is_free() {
    let lister = Scripted::new([(
        "s",
        vec![Step::Reply(
            Duration::ZERO,
            tools("server-memory.tools.json"),
        )],
    )]);
    let (shared, store) = leased(&["busy", "busy"]);
    let freshener =
        Freshener::start(shared, Arc::clone(&lister), config().build().unwrap()).unwrap();
    let s = server("s");
    let outcome = freshener.refresh(&s).await.unwrap();
    assert!(matches!(outcome, RefreshOutcome::Stored(_)), "{outcome:?}");
    assert_eq!(store.asked.load(Ordering::SeqCst), 3, "asked until free");
    let calls = lister.calls("s");
    assert_eq!(
        calls.len(),
        1,
        "listed once, after the other process: {calls:?}"
    );
    assert!(calls[0] >= 0.2, "not before the lease was free: {calls:?}");
    assert_eq!(freshener.catalog().live(&s).unwrap().tools.len(), 9);
    freshener.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn on_a_shared_catalogue_another_process_listing_stands() {
    let lister = Scripted::new([(
        "s",
        vec![Step::Reply(
            Duration::ZERO,
            tools("server-memory.tools.json"),
        )],
    )]);
    let (shared, _store) = leased(&["satisfied"]);
    let freshener =
        Freshener::start(shared, Arc::clone(&lister), config().build().unwrap()).unwrap();
    let outcome = freshener.refresh(&server("s")).await.unwrap();
    assert_eq!(
        outcome,
        RefreshOutcome::Shared {
            version: CatalogVersion(7)
        }
    );
    assert!(lister.calls("s").is_empty(), "not listed again");
    freshener.shutdown().await;
}

/// A listing dropped mid-way (shut down while the server hangs, its lease held) releases
/// the lease with it: no guard outlives the freshener's tasks.
#[tokio::test(start_paused = true)]
async fn a_listing_dropped_mid_way_releases_its_lease() {
    let lister = Scripted::new([("s", vec![Step::Hang])]);
    let (shared, store) = leased(&[]);
    let freshener =
        Freshener::start(shared, Arc::clone(&lister), config().build().unwrap()).unwrap();
    freshener.connect(&server("s"));
    sleep(secs(1.0)).await;
    assert_eq!(lister.calls("s").len(), 1, "listing, the lease held");
    assert_eq!(Arc::strong_count(&store.held), 2, "one guard alive");
    freshener.shutdown().await;
    assert_eq!(
        Arc::strong_count(&store.held),
        1,
        "the guard went with the listing"
    );
}
