//! The data of the lazy-assembly measurement: two record logs of 1,000 records each, the
//! same conversation except for ten earlier tool results, 2 KB each in one log and
//! 256 MiB each in the other (2.5 GiB), written once under `target/bench-data/` and
//! reused; and one step's assembly over a log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use psych_elision::{Elider, Estimator};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, ProjectionCache, StaticSections,
    StepHistory, Transient,
};
use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{
    AssistantMessage, Record, RunId, ToolCall, ToolCallId, ToolOutput, ToolResult, UserMessage,
};

/// Records in each log.
pub const RECORDS: u64 = 1_000;
/// Size of each of the ten large results.
pub const LARGE: usize = 256 << 20;
/// Size of each of the ten results in the small log.
pub const SMALL: usize = 2_000;

/// Where the logs live: `target/bench-data/lazy-history/`.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-data/lazy-history")
}

/// Lines of a server log, `len` bytes in all (the last line cut to fit).
fn server_log(len: usize, seed: usize) -> String {
    let mut out = String::with_capacity(len + 128);
    let mut i = seed;
    while out.len() < len {
        out.push_str(&format!(
            "2026-11-30T12:{:02}:{:02}Z INFO GET /api/items/{i} 200 {}ms user={}\n",
            i / 60 % 60,
            i % 60,
            i % 97,
            i % 13
        ));
        i += 1;
    }
    out.truncate(len);
    out
}

/// The log of Run `run` with the ten results of `size` bytes, written if it is not there.
///
/// # Panics
///
/// On any I/O failure: this is benchmark setup.
pub fn log(run: &str, size: usize) -> RecordLog {
    let dir = dir();
    std::fs::create_dir_all(&dir).unwrap();
    let run = RunId::new(run).unwrap();
    let (mut log, _) = RecordLog::open(&dir, &run, SyncPolicy::OsBuffered).unwrap();
    if log.len() == RECORDS {
        return log;
    }
    assert!(
        log.is_empty(),
        "a partial bench log: remove {}",
        log.path().display()
    );
    log.set_estimator(Arc::new(Estimator::new()));
    let large = server_log(size, 0);
    let mut turn = 0usize;
    let mut big_left = 10;
    // Turns of six records: user, assistant with two calls, two results, reply. Every
    // fifteenth turn's first result is one of the ten; the last turn (after the last user
    // message) is the current one.
    while log.len() < RECORDS {
        let left = RECORDS - log.len();
        log.append(&Record::User(UserMessage {
            text: format!("Turn {turn}: what happened on the server around request {turn}?"),
        }))
        .unwrap();
        if left == 1 {
            break;
        }
        let ids = [format!("toolu_{turn}_a"), format!("toolu_{turn}_b")];
        log.append(&Record::Assistant(AssistantMessage {
            text: "Let me look at the logs.".into(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: ToolCallId::new(id.clone()).unwrap(),
                    name: "read_log".into(),
                    arguments: serde_json::json!({"from": turn}),
                })
                .collect(),
        }))
        .unwrap();
        for (k, id) in ids.iter().enumerate() {
            if log.len() == RECORDS {
                break;
            }
            let text = if k == 0 && turn % 15 == 3 && big_left > 0 {
                big_left -= 1;
                large.clone()
            } else {
                server_log(1_200 + (turn * 37 + k * 101) % 900, turn * 10 + k)
            };
            log.append(&Record::ToolResult(ToolResult {
                target: None,
                call_id: ToolCallId::new(id.clone()).unwrap(),
                name: "read_log".into(),
                output: ToolOutput::text(text),
            }))
            .unwrap();
        }
        if log.len() < RECORDS {
            log.append(&Record::Assistant(AssistantMessage {
                text: format!("Request {turn} was served normally."),
                tool_calls: Vec::new(),
            }))
            .unwrap();
        }
        turn += 1;
    }
    assert_eq!(big_left, 0, "all ten large results are in the history");
    log.sync().unwrap();
    log
}

/// The fixed parts of the request.
pub struct Fixed {
    zone1: StaticSections,
    zone2: DynamicTail,
    transient: Transient,
    options: AnthropicOptions,
    elider: Elider,
}

impl Fixed {
    /// Zone 1 and 2, the clock, the default elider.
    pub fn new() -> Self {
        Self {
            zone1: StaticSections::new("You are a careful site-reliability assistant."),
            zone2: DynamicTail::new().memory("The user runs the server on Linux."),
            transient: Transient::at(CurrentTime::utc(1_796_041_497).unwrap()),
            options: AnthropicOptions::new("claude-sonnet-4-5", 4096),
            elider: Elider::default(),
        }
    }

    /// One step's assembly from cold: the history read from the log's metadata, every
    /// turn behind the boundary projected (an empty projection cache: the first step after
    /// the boundary moved, the costliest), the request rendered. Returns its length.
    pub fn step(&self, log: &RecordLog) -> usize {
        let history = log.history().unwrap();
        let mut cache = ProjectionCache::new();
        let step = StepHistory::load(&history, log, &self.elider, &mut cache).unwrap();
        let prompt = Assembler::new(&self.zone1, &self.zone2, &[])
            .assemble_history(&step, &self.transient)
            .unwrap();
        prompt.render_anthropic(&self.options).unwrap().body().len()
    }
}
