//! The measurement corpus of the estimator: realistic text of each content type a tool
//! result carries, read or generated at test time.
//!
//! JSON is the real catalogues of `shared/fixtures/catalogs` (rendered the way a JSON tool
//! output is shown, pretty) and generated API responses dense with ids, hashes, timestamps
//! and URLs; prose is the spec and the catalogues' tool descriptions; code is this
//! workspace's own Rust sources; CJK is the committed `cjk.txt`; base64 is random bytes
//! encoded and the icon data URIs of `github.tools.full.json`. Generated content comes from
//! a fixed-seed generator, so every run measures the same bytes.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// One content type: a name and its documents.
pub(crate) struct Corpus {
    /// The content type, as the accuracy table names it.
    pub(crate) kind: String,
    /// Its documents, each measured whole.
    pub(crate) docs: Vec<String>,
}

/// The `shared/fixtures` folder above the crate (or `$PSYCH_FIXTURES`).
pub(crate) fn fixtures_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PSYCH_FIXTURES") {
        return PathBuf::from(dir);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|dir| dir.join("shared/fixtures"))
        .find(|dir| dir.join("catalogs").is_dir())
        .unwrap_or_else(|| panic!("no shared/fixtures above {}", manifest.display()))
}

/// The `shared/spec` folder beside `shared/fixtures`.
fn spec_dir() -> PathBuf {
    fixtures_dir()
        .parent()
        .map(|shared| shared.join("spec"))
        .filter(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no shared/spec beside {}", fixtures_dir().display()))
}

/// The real catalogues, parsed, in file-name order.
pub(crate) fn catalogues() -> Vec<(String, Value)> {
    let mut files = std::fs::read_dir(fixtures_dir().join("catalogs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect::<Vec<_>>();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, serde_json::from_str(&text).unwrap())
        })
        .collect()
}

/// A small deterministic generator (SplitMix64), so generated corpora are the same bytes
/// on every machine.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `items`.
    pub(crate) fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    /// `n` random bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// `n` lowercase hex digits.
    pub(crate) fn hex(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| char::from(b"0123456789abcdef"[self.below(16) as usize]))
            .collect()
    }

    /// A timestamp in 2025–2026, RFC 3339, UTC.
    pub(crate) fn timestamp(&mut self) -> String {
        format!(
            "202{}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            5 + self.below(2),
            1 + self.below(12),
            1 + self.below(28),
            self.below(24),
            self.below(60),
            self.below(60)
        )
    }

    /// A GitHub-style node id: a type prefix and base64 of a packed id.
    pub(crate) fn node_id(&mut self, prefix: &str) -> String {
        let raw = self.bytes(12);
        let coded = psych_types::encode_base64(&raw);
        format!("{prefix}_kwDO{}", coded.trim_end_matches('='))
    }
}

const WORDS: &[&str] = &[
    "fix",
    "crash",
    "when",
    "the",
    "catalog",
    "refresh",
    "runs",
    "during",
    "a",
    "turn",
    "add",
    "support",
    "for",
    "pagination",
    "in",
    "list",
    "tools",
    "server",
    "returns",
    "error",
    "timeout",
    "after",
    "reconnect",
    "deferred",
    "prompt",
    "cache",
    "miss",
    "schema",
    "validation",
    "rejects",
    "valid",
    "input",
    "handle",
    "large",
    "results",
    "update",
    "docs",
    "example",
    "config",
    "token",
    "budget",
    "flaky",
    "test",
    "on",
    "windows",
    "memory",
    "leak",
    "stream",
    "close",
    "retry",
    "policy",
    "rate",
    "limit",
];

const LOGINS: &[&str] = &[
    "octocat",
    "hubot",
    "mona-lisa",
    "dependabot[bot]",
    "jsmith42",
    "a-kowalska",
    "renovate[bot]",
    "tkaneko",
    "li-wei-dev",
    "mmuller",
];

fn sentence(rng: &mut Rng, words: usize) -> String {
    let mut out = Vec::with_capacity(words);
    for _ in 0..words {
        out.push(rng.pick(WORDS));
    }
    let mut text = out.join(" ");
    if let Some(first) = text.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    text
}

fn user(rng: &mut Rng) -> Value {
    let login = rng.pick(LOGINS);
    let id = 1_000_000 + rng.below(180_000_000);
    json!({
        "login": login,
        "id": id,
        "node_id": rng.node_id("U"),
        "avatar_url": format!("https://avatars.githubusercontent.com/u/{id}?v=4"),
        "gravatar_id": "",
        "url": format!("https://api.github.com/users/{login}"),
        "html_url": format!("https://github.com/{login}"),
        "type": if login.ends_with("[bot]") { "Bot" } else { "User" },
        "site_admin": false,
    })
}

/// A GitHub `list_issues`-shaped response: issues with users, labels, reactions.
pub(crate) fn github_issues(rng: &mut Rng, count: usize) -> Value {
    let issues = (0..count)
        .map(|i| {
            let number = 4000 - i as u64 * 3;
            let repo = "https://api.github.com/repos/acme/psych";
            let labels = (0..rng.below(3))
                .map(|_| {
                    let name = rng.pick(&["bug", "enhancement", "needs-triage", "area/catalog"]);
                    json!({
                        "id": 5_000_000_000u64 + rng.below(900_000_000),
                        "node_id": rng.node_id("LA"),
                        "url": format!("{repo}/labels/{name}"),
                        "name": name,
                        "color": rng.hex(6),
                        "default": false,
                        "description": sentence(rng, 5),
                    })
                })
                .collect::<Vec<_>>();
            json!({
                "id": 2_400_000_000u64 + rng.below(90_000_000),
                "node_id": rng.node_id("I"),
                "url": format!("{repo}/issues/{number}"),
                "repository_url": repo,
                "html_url": format!("https://github.com/acme/psych/issues/{number}"),
                "number": number,
                "state": rng.pick(&["open", "closed"]),
                "title": sentence(rng, 7),
                "body": format!("{}.\n\n### Steps\n1. {}\n2. {}\n", sentence(rng, 14), sentence(rng, 6), sentence(rng, 8)),
                "user": user(rng),
                "labels": labels,
                "assignee": Value::Null,
                "comments": rng.below(40),
                "created_at": rng.timestamp(),
                "updated_at": rng.timestamp(),
                "closed_at": Value::Null,
                "author_association": rng.pick(&["MEMBER", "CONTRIBUTOR", "NONE"]),
                "reactions": {
                    "url": format!("{repo}/issues/{number}/reactions"),
                    "total_count": rng.below(9), "+1": rng.below(5), "-1": 0, "laugh": 0,
                    "hooray": 0, "confused": 0, "heart": rng.below(3), "rocket": 0, "eyes": 0,
                },
            })
        })
        .collect::<Vec<_>>();
    Value::Array(issues)
}

/// A GitHub `list_commits`-shaped response: shas, trees, parents, authors, verification.
pub(crate) fn github_commits(rng: &mut Rng, count: usize) -> Value {
    let commits = (0..count)
        .map(|_| {
            let sha = rng.hex(40);
            let repo = "https://api.github.com/repos/acme/psych";
            json!({
                "sha": sha,
                "node_id": rng.node_id("C"),
                "commit": {
                    "author": {"name": "Mona Lisa", "email": "mona@example.com", "date": rng.timestamp()},
                    "committer": {"name": "GitHub", "email": "noreply@github.com", "date": rng.timestamp()},
                    "message": sentence(rng, 9),
                    "tree": {"sha": rng.hex(40), "url": format!("{repo}/git/trees/{}", rng.hex(40))},
                    "url": format!("{repo}/git/commits/{sha}"),
                    "comment_count": 0,
                    "verification": {"verified": true, "reason": "valid", "signature": Value::Null, "payload": Value::Null, "verified_at": rng.timestamp()},
                },
                "url": format!("{repo}/commits/{sha}"),
                "html_url": format!("https://github.com/acme/psych/commit/{sha}"),
                "author": user(rng),
                "parents": [{"sha": rng.hex(40), "url": format!("{repo}/commits/{}", rng.hex(40))}],
            })
        })
        .collect::<Vec<_>>();
    Value::Array(commits)
}

/// A cloud-API-shaped response: UUIDs, ARNs, ETags, epoch times, request ids.
pub(crate) fn cloud_resources(rng: &mut Rng, count: usize) -> Value {
    let items = (0..count)
        .map(|_| {
            let uuid = format!(
                "{}-{}-{}-{}-{}",
                rng.hex(8),
                rng.hex(4),
                rng.hex(4),
                rng.hex(4),
                rng.hex(12)
            );
            json!({
                "id": uuid,
                "arn": format!("arn:aws:lambda:eu-west-1:{}:function:psych-{}", 100_000_000_000u64 + rng.below(899_999_999_999), rng.hex(6)),
                "etag": format!("\"{}\"", rng.hex(32)),
                "status": rng.pick(&["ACTIVE", "PENDING", "FAILED"]),
                "createdAt": 1_700_000_000 + rng.below(80_000_000),
                "sizeBytes": rng.below(50_000_000),
                "checksum": format!("sha256:{}", rng.hex(64)),
                "tags": {"team": rng.pick(&["platform", "agents", "infra"]), "env": rng.pick(&["prod", "staging"])},
                "requestId": rng.node_id("REQ"),
            })
        })
        .collect::<Vec<_>>();
    json!({"items": items, "nextToken": psych_types::encode_base64(&rng.bytes(48))})
}

/// Every text-valued `description` in a JSON value, in document order.
fn descriptions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match value {
                    Value::String(text) if key == "description" => out.push(text.clone()),
                    _ => descriptions(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| descriptions(item, out)),
        _ => {}
    }
}

/// Every `data:` URI's base64 payload in a JSON value.
fn data_uris(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(text) => {
            if let Some((_, payload)) = text
                .strip_prefix("data:")
                .and_then(|t| t.split_once(";base64,"))
            {
                out.push(payload.to_owned());
            }
        }
        Value::Object(map) => map.values().for_each(|v| data_uris(v, out)),
        Value::Array(items) => items.iter().for_each(|v| data_uris(v, out)),
        _ => {}
    }
}

fn rust_sources(dir: &Path, out: &mut Vec<String>) {
    let mut files = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect::<Vec<_>>();
    files.sort();
    for path in files {
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// Every content type of the measurement, in table order.
pub(crate) fn corpora() -> Vec<Corpus> {
    let catalogues = catalogues();
    let mut rng = Rng(0x5053_5943_4845_4c49);

    let json_catalogues = catalogues
        .iter()
        .map(|(_, value)| psych_types::render_json(value))
        .collect();

    let json_api = vec![
        psych_types::render_json(&github_issues(&mut rng, 30)),
        psych_types::render_json(&github_commits(&mut rng, 30)),
        psych_types::render_json(&cloud_resources(&mut rng, 40)),
    ];

    let mut prose = std::fs::read_dir(spec_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect::<Vec<_>>();
    prose.sort();
    let mut prose = prose
        .into_iter()
        .map(|path| std::fs::read_to_string(path).unwrap())
        .collect::<Vec<_>>();
    let mut described = Vec::new();
    for (_, value) in &catalogues {
        descriptions(&value["tools"], &mut described);
    }
    prose.push(described.join("\n\n"));

    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut code = Vec::new();
    rust_sources(&manifest.join("src"), &mut code);
    rust_sources(&manifest.join("../types/src"), &mut code);

    let cjk = include_str!("cjk.txt");
    let (zh, ja) = cjk.split_once("# 日本語").unwrap();

    let random_base64 = [3usize, 100, 1000, 20_000]
        .iter()
        .map(|&n| psych_types::encode_base64(&rng.bytes(n)))
        .collect();
    let mut icons = Vec::new();
    for (_, value) in &catalogues {
        data_uris(value, &mut icons);
    }

    vec![
        Corpus {
            kind: "json: catalogues".to_owned(),
            docs: json_catalogues,
        },
        Corpus {
            kind: "json: api (ids, hashes)".to_owned(),
            docs: json_api,
        },
        Corpus {
            kind: "prose (english)".to_owned(),
            docs: prose,
        },
        Corpus {
            kind: "code (rust)".to_owned(),
            docs: code,
        },
        Corpus {
            kind: "cjk: chinese".to_owned(),
            docs: vec![zh.to_owned()],
        },
        Corpus {
            kind: "cjk: japanese".to_owned(),
            docs: vec![ja.to_owned()],
        },
        Corpus {
            kind: "base64: random".to_owned(),
            docs: random_base64,
        },
        Corpus {
            kind: "base64: icon uris".to_owned(),
            docs: icons,
        },
    ]
}

/// A half of the committed multilingual and tool-output corpus (`text/`, gathered by
/// `gather.py`; see `README.md` beside it): its sources were dealt into the two halves
/// before the weights were fitted, and only the fitting half was fitted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Half {
    /// The sources the weights were fitted on (`text/fit`).
    #[allow(
        dead_code,
        reason = "the fitting tool and the benchmark read it, not the tests"
    )]
    Fit,
    /// The sources kept out of the fit (`text/held`).
    Held,
}

/// The content types of one half of `text/`, in name order, each with its sources (one
/// document each) in name order.
pub(crate) fn texts(half: Half) -> Vec<Corpus> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus/text")
        .join(match half {
            Half::Fit => "fit",
            Half::Held => "held",
        });
    let sorted = |dir: &Path| {
        let mut paths = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect::<Vec<_>>();
        paths.sort();
        paths
    };
    sorted(&dir)
        .into_iter()
        .map(|kind_dir| Corpus {
            kind: kind_dir.file_name().unwrap().to_string_lossy().into_owned(),
            docs: sorted(&kind_dir)
                .iter()
                .map(|path| std::fs::read_to_string(path).unwrap())
                .collect(),
        })
        .collect()
}

/// The consecutive slices of `doc` of about `size` bytes, each cut back to a char
/// boundary; a last slice shorter than `size` is left out.
pub(crate) fn slices(doc: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start + size <= doc.len() {
        let mut end = start + size;
        while !doc.is_char_boundary(end) {
            end -= 1;
        }
        out.push(&doc[start..end]);
        start = end;
    }
    out
}
