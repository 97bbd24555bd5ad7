//! Realistic tool catalogues of any size, generated: one vocabulary and one schema style per
//! kind of server ([`SyntheticKind`]: notes, files, wiki, forge, suite), with names as real
//! servers have them (`list_issues`, `API-retrieve-a-page`, `crm_list_customers`),
//! descriptions whose lengths follow the real catalogues', and input schemas with nested
//! objects and arrays, `$defs` and `$ref`, `anyOf`/`oneOf`, enums, bounds, `required`, and a
//! little non-ASCII text.
//!
//! The shape is measured from the real `tools/list` catalogues in
//! `../shared/fixtures/catalogs/` (never copied here): github 117 tools, notion 24,
//! playwright 25, server-filesystem 14, server-memory 9, 189 in all. Figures per tool over
//! the 189 (nesting depth counts `properties`/`items` levels below the input schema, `$defs`
//! entries measured from their own root, `$ref` not followed):
//!
//! | | all 189 | github | notion | filesystem | memory |
//! |---|---:|---:|---:|---:|---:|
//! | `$ref` (+ `$defs`) | 12.7% | 0 | 100% | 0 | 0 |
//! | `anyOf`/`oneOf` | 15.9% | 4.3% | 100% | 0 | 0 |
//! | `enum` | 48.1% | 50.4% | 100% | 7.1% | 0 |
//! | non-ASCII text | 3.2% | 5.1% | 0 | 0 | 0 |
//! | depth 0 / 1 / 2 / 3 / 4 | 3 / 65 / 12 / 17 / 3% | max 3, median 1 | median 3, max 4 | max 3, median 1 | median 3, max 4 |
//! | description chars, median (p10–p90) | 65 (30–280) | 71 (36–222), max 1,115 | 62 (54–74) | 309 (185–424) | 57 (50–80) |
//! | bytes per tool, mean | — | 1,075 | 3,175 | 926 | 1,193 |
//!
//! The non-ASCII text of the real catalogues is punctuation in parameter descriptions
//! (`—`, `→`); the generator also writes accented names and other scripts in a few suite
//! and wiki descriptions, where user data shows through. Each kind takes the figures of the
//! server it stands for; suite takes the figures of all 189. `tests/tests/synthetic_catalogs.rs`
//! of psych-tests measures the generated catalogues the same way and compares.
//!
//! Deterministic: tool `i` of a kind depends only on the kind, `i` and a fixed seed, so the
//! same size always gives the same tools (prompts built from them can be snapshotted) and a
//! smaller catalogue is a prefix of a larger one.

use psych_types::{JsonObject, ToolAnnotations, ToolDefinition, ToolName};
use serde::Deserialize;
use serde_json::{Value, json};

/// The seed every generated catalogue derives from.
const SEED: u64 = 0x5053_5943_485f_0013;

/// The kind of server a generated catalogue looks like.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SyntheticKind {
    /// Notes and reminders, shaped like server-memory: a few tools, short descriptions,
    /// arrays of objects holding arrays of strings.
    Notes,
    /// Workspace files, shaped like server-filesystem: long descriptions about paths, small
    /// flat schemas, a title, annotations and an output schema on every tool.
    Files,
    /// Wiki pages and databases, shaped like notion: `API-verb-noun` names, short
    /// `Wiki | …` descriptions with their error responses, `$defs` with `$ref`, `oneOf` and
    /// enums in every tool.
    Wiki,
    /// Code hosting, shaped like github: `owner`/`repo` on most tools, enums on half,
    /// descriptions from a few words to a page, annotations on every tool.
    Forge,
    /// An all-in-one business suite (CRM, billing, support, HR…) of any size, with the
    /// figures of all the real catalogues together.
    #[default]
    Suite,
}

impl SyntheticKind {
    /// Every kind, in a fixed order.
    pub const ALL: [Self; 5] = [
        Self::Notes,
        Self::Files,
        Self::Wiki,
        Self::Forge,
        Self::Suite,
    ];

    /// The kind's name: `notes`, `files`, `wiki`, `forge` or `suite`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Notes => "notes",
            Self::Files => "files",
            Self::Wiki => "wiki",
            Self::Forge => "forge",
            Self::Suite => "suite",
        }
    }

    /// The kind named `name` (as [`SyntheticKind::name`] spells it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    fn profile(self) -> &'static Profile {
        match self {
            Self::Notes => &NOTES,
            Self::Files => &FILES,
            Self::Wiki => &WIKI,
            Self::Forge => &FORGE,
            Self::Suite => &SUITE,
        }
    }
}

/// `count` tools of a suite server ([`SyntheticKind::Suite`]); see [`synthetic_catalog`].
pub fn synthetic_tools(count: usize) -> Vec<ToolDefinition> {
    synthetic_catalog(SyntheticKind::Suite, count)
}

/// `count` tools named and shaped like those of a real server of this kind. Names are
/// unique, valid MCP tool names and valid provider function names (`[A-Za-z0-9_-]`, at most
/// 64 bytes); once a kind's plain names run out, an area prefix and then a number keep them
/// unique. Every input schema compiles as JSON Schema draft 2020-12 with local `$ref`s only.
pub fn synthetic_catalog(kind: SyntheticKind, count: usize) -> Vec<ToolDefinition> {
    (0..count).filter_map(|i| tool(kind, i)).collect()
}

/// How names are spelled.
#[derive(Clone, Copy)]
enum Naming {
    /// `verb_noun`, then `area_verb_noun`.
    Snake,
    /// `API-verb-noun`, then `API-area-verb-noun` (notion's generated names).
    Api,
}

/// One kind's vocabulary and the figures its tools follow (shares in per mille).
struct Profile {
    naming: Naming,
    verbs: &'static [&'static str],
    nouns: &'static [&'static str],
    areas: &'static [&'static str],
    /// Description lengths in characters at the 0, 10, 25, 50, 75, 90 and 100th percentile.
    lengths: [usize; 7],
    /// Sentences a description is filled with; `{n}` is the noun, `{v}` the verb.
    sentences: &'static [&'static str],
    /// How the first sentence ends (after "Verb noun").
    scope: &'static str,
    /// Weights of nesting depths 0 to 4.
    depths: [u32; 5],
    ref_share: u32,
    any_of_share: u32,
    enum_share: u32,
    non_ascii_share: u32,
    /// Extra scalar properties: at least this many, plus up to `extra_props_spread`.
    extra_props: usize,
    extra_props_spread: usize,
    /// Properties on every tool with a depth above 0.
    base: &'static [(&'static str, &'static str, &'static str)],
    /// Non-ASCII sentences for descriptions.
    non_ascii: &'static [&'static str],
    title: bool,
    output_schema: bool,
    schema_uri: Option<&'static str>,
}

/// Scalar properties any kind may draw: name, type, description.
const SCALARS: [(&str, &str, &str); 24] = [
    (
        "query",
        "string",
        "Free text to match against titles and bodies.",
    ),
    (
        "per_page",
        "integer",
        "Results per page (1-100, default 30).",
    ),
    (
        "page",
        "integer",
        "Page number of the results to fetch, from 1.",
    ),
    (
        "cursor",
        "string",
        "The next_cursor of the previous response, to continue a listing.",
    ),
    (
        "since",
        "string",
        "Only items updated at or after this time, ISO 8601.",
    ),
    (
        "until",
        "string",
        "Only items updated before this time, ISO 8601.",
    ),
    ("title", "string", "The title, plain text."),
    ("body", "string", "The body, Markdown."),
    ("include_archived", "boolean", "Also return archived items."),
    (
        "dry_run",
        "boolean",
        "Report what would change without changing it.",
    ),
    (
        "limit",
        "integer",
        "The most items to return; the server may return fewer.",
    ),
    ("owner_id", "string", "The id of the owning user or team."),
    (
        "assignee",
        "string",
        "Login or email of the person to assign.",
    ),
    ("due_date", "string", "Due date, YYYY-MM-DD."),
    (
        "notify",
        "boolean",
        "Send notifications to watchers (default true).",
    ),
    ("locale", "string", "BCP 47 language tag for the response."),
    ("timezone", "string", "IANA time zone, e.g. Europe/Paris."),
    ("external_id", "string", "Your own id for this item."),
    ("reason", "string", "Why, shown in the audit log."),
    ("parent_id", "string", "The id of the parent item."),
    ("template_id", "string", "Start from this template."),
    (
        "version",
        "integer",
        "Expected current version, for optimistic locking.",
    ),
    ("fields", "string", "Comma-separated fields to include."),
    (
        "expand",
        "string",
        "Related objects to inline, comma-separated.",
    ),
];

/// Enumerations: property name, description, values.
const ENUMS: [(&str, &str, &[&str]); 8] = [
    ("state", "Filter by state.", &["open", "closed", "all"]),
    (
        "sort",
        "What to sort results by.",
        &["created", "updated", "comments", "relevance"],
    ),
    ("direction", "Sort direction.", &["asc", "desc"]),
    (
        "visibility",
        "Who can see it.",
        &["private", "internal", "public"],
    ),
    (
        "priority",
        "Priority.",
        &["urgent", "high", "medium", "low", "none"],
    ),
    (
        "format",
        "The response format.",
        &["json", "markdown", "csv"],
    ),
    (
        "status",
        "The workflow status.",
        &[
            "draft",
            "pending_review",
            "approved",
            "rejected",
            "archived",
        ],
    ),
    ("method", "How to merge.", &["merge", "squash", "rebase"]),
];

const NOTES: Profile = Profile {
    naming: Naming::Snake,
    verbs: &[
        "create", "add", "search", "open", "delete", "read", "update", "pin", "tag",
    ],
    nouns: &[
        "notes",
        "observations",
        "reminders",
        "links",
        "notebooks",
        "checklists",
        "tags",
        "graph",
        "attachments",
        "relations",
    ],
    areas: &["shared", "archive", "inbox", "journal"],
    lengths: [31, 50, 51, 57, 65, 80, 106],
    sentences: &[
        "Matches names, kinds and content.",
        "Silently ignores {n} that do not exist.",
        "Each one keeps its history.",
    ],
    scope: "in the personal knowledge base",
    depths: [1, 0, 1, 2, 5],
    ref_share: 0,
    any_of_share: 0,
    enum_share: 0,
    non_ascii_share: 0,
    extra_props: 0,
    extra_props_spread: 0,
    base: &[],
    non_ascii: &[],
    title: true,
    output_schema: true,
    schema_uri: Some("http://json-schema.org/draft-07/schema#"),
};

const FILES: Profile = Profile {
    naming: Naming::Snake,
    verbs: &[
        "read", "write", "edit", "list", "move", "search", "get", "create", "copy", "watch",
    ],
    nouns: &[
        "text_file",
        "media_file",
        "multiple_files",
        "directory",
        "directory_tree",
        "file_info",
        "allowed_directories",
        "symlink",
        "archive",
        "directory_with_sizes",
    ],
    areas: &["workspace", "home", "cache", "shared"],
    lengths: [85, 185, 234, 309, 325, 424, 457],
    sentences: &[
        "Only works within allowed directories.",
        "Handles various text encodings and provides detailed error messages if the {n} cannot be read.",
        "Use this tool when you need to examine the contents of a {n} or understand its structure.",
        "Paths may be absolute or relative to the first allowed directory; symlinks are resolved before the check.",
        "Returns the result with clear [FILE] and [DIR] prefixes, one entry per line.",
        "Use with caution as it will overwrite existing content without warning.",
        "Failed reads for individual paths won't stop the entire operation.",
        "Returns a git-style diff showing the changes made.",
    ],
    scope: "on the local file system",
    depths: [1, 8, 2, 2, 0],
    ref_share: 0,
    any_of_share: 0,
    enum_share: 71,
    non_ascii_share: 0,
    extra_props: 0,
    extra_props_spread: 2,
    base: &[("path", "string", "")],
    non_ascii: &[],
    title: true,
    output_schema: true,
    schema_uri: Some("http://json-schema.org/draft-07/schema#"),
};

const WIKI: Profile = Profile {
    naming: Naming::Api,
    verbs: &[
        "retrieve", "patch", "post", "get", "delete", "query", "create", "update", "move", "list",
    ],
    nouns: &[
        "a-page",
        "a-database",
        "a-data-source",
        "block-children",
        "a-comment",
        "a-user",
        "page-property",
        "a-block",
        "self",
        "search",
        "a-template",
        "a-view",
    ],
    areas: &["team", "archive", "public", "private"],
    lengths: [49, 54, 57, 62, 65, 74, 280],
    sentences: &[
        "\nError Responses:\n400: Bad request",
        "\n404: Not found",
        "\n429: Rate limited",
        "\nReturns the {n} object with its properties and parent.",
    ],
    scope: "",
    depths: [0, 0, 1, 3, 1],
    ref_share: 1000,
    any_of_share: 1000,
    enum_share: 1000,
    non_ascii_share: 90,
    extra_props: 1,
    extra_props_spread: 3,
    base: &[("page_id", "string", "Identifier for a wiki page")],
    non_ascii: &[
        " Titles keep their emoji and accents (📝 Réunion d'équipe).",
        " Sorts by Unicode collation: Ärger after Zebra is a bug → report it.",
    ],
    title: false,
    output_schema: false,
    schema_uri: None,
};

const FORGE: Profile = Profile {
    naming: Naming::Snake,
    verbs: &[
        "list", "create", "get", "update", "search", "merge", "add", "delete", "rerun", "assign",
        "cancel", "download",
    ],
    nouns: &[
        "issues",
        "pull_request",
        "repository",
        "branch",
        "commit",
        "workflow_run",
        "release",
        "tag",
        "label",
        "discussion",
        "gist",
        "code_scanning_alert",
        "secret_scanning_alert",
        "notification",
        "project_item",
        "team",
        "review_comment",
        "sub_issue",
        "dependabot_alert",
        "job_logs",
    ],
    areas: &["org", "enterprise", "actions", "security"],
    lengths: [17, 36, 46, 71, 166, 222, 1115],
    sentences: &[
        "Use this when the user asks about {n} in a repository.",
        "Results are paginated; use per_page and page to walk them.",
        "Only {n} the authenticated user can see are returned.",
        "Supports the same qualifiers as the web search, e.g. is:open author:octocat label:bug.",
        "Requires write access to the repository.",
        "The response includes the {n}'s URL, state, author, timestamps and, where it applies, its labels and assignees.",
        "For large repositories prefer filtering by branch or path first: an unfiltered listing can be slow and is truncated after 1,000 entries.",
        "To find the right id, list the {n} first.",
    ],
    scope: "in a repository",
    depths: [3, 80, 8, 9, 0],
    ref_share: 0,
    any_of_share: 43,
    enum_share: 504,
    non_ascii_share: 51,
    extra_props: 1,
    extra_props_spread: 6,
    base: &[
        (
            "owner",
            "string",
            "Repository owner (username or organization)",
        ),
        ("repo", "string", "Repository name"),
    ],
    non_ascii: &[
        " Infer the label from the text (e.g. 'Crashes when saving' → bug, 'Dark mode please' → feature).",
        " Mutually exclusive with 'fields' — provide one or the other.",
    ],
    title: false,
    output_schema: false,
    schema_uri: None,
};

const SUITE: Profile = Profile {
    naming: Naming::Snake,
    verbs: &[
        "list", "get", "create", "update", "delete", "search", "archive", "export", "approve",
        "assign",
    ],
    nouns: &[
        "customers",
        "deal",
        "invoice",
        "subscription",
        "support_ticket",
        "knowledge_article",
        "employee",
        "time_off_request",
        "report",
        "dashboard",
        "campaign",
        "meeting",
        "message",
        "channel",
        "expense",
        "purchase_order",
        "vendor",
        "payroll_run",
        "contract",
        "lead",
    ],
    areas: &[
        "crm",
        "billing",
        "support",
        "docs",
        "hr",
        "analytics",
        "marketing",
        "calendar",
        "chat",
        "finance",
        "procurement",
        "legal",
    ],
    lengths: [14, 30, 49, 65, 161, 280, 1115],
    sentences: &[
        "Use this when the user asks to {v} {n}.",
        "Results are paginated and sorted by last update.",
        "Returns the {n} with its id, title, state, owner and timestamps.",
        "Requires the admin role in the workspace.",
        "Deleted items stay recoverable for 30 days; use include_archived to see them.",
        "Amounts are in the workspace's currency, in minor units (cents).",
        "Changes are recorded in the audit log with the caller's identity and the reason given.",
        "Bulk changes of more than 500 {n} run as a background job: the response carries a job id to poll.",
    ],
    scope: "in the workspace",
    depths: [3, 65, 12, 17, 3],
    ref_share: 127,
    // With the `oneOf` every `$ref` tool carries, 12.7% + 87.3% x 3.7% = 15.9%.
    any_of_share: 37,
    enum_share: 481,
    non_ascii_share: 32,
    extra_props: 1,
    extra_props_spread: 5,
    base: &[(
        "workspace_id",
        "string",
        "The workspace, as returned by list_workspaces.",
    )],
    non_ascii: &[
        " Names keep their accents and scripts (Zoë Müller, São Paulo, 東京) — search folds accents.",
        " Currency codes are ISO 4217; amounts in € or ¥ are converted at the day's rate.",
    ],
    title: false,
    output_schema: false,
    schema_uri: None,
};

/// splitmix64: small, fast, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn new(kind: SyntheticKind, i: usize) -> Self {
        let kind_index = SyntheticKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(0) as u64;
        Self(SEED ^ (kind_index << 56) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True with this chance in a thousand.
    fn per_mille(&mut self, share: u32) -> bool {
        self.next() % 1000 < u64::from(share)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index drawn with these weights.
    fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        let mut pick = self.next() % total.max(1);
        for (index, weight) in weights.iter().enumerate() {
            if pick < u64::from(*weight) {
                return index;
            }
            pick -= u64::from(*weight);
        }
        0
    }
}

/// A length drawn from the percentile table (linear between its points).
fn sample_length(rng: &mut Rng, lengths: &[usize; 7]) -> usize {
    const AT: [f64; 7] = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0];
    let u = rng.unit();
    let mut k = 0;
    while k + 2 < AT.len() && u >= AT[k + 1] {
        k += 1;
    }
    let (lo, hi) = (lengths[k] as f64, lengths[k + 1] as f64);
    let t = (u - AT[k]) / (AT[k + 1] - AT[k]);
    (lo + t * (hi - lo)).round() as usize
}

/// The name of tool `i`, its verb and its noun.
fn name(profile: &Profile, i: usize) -> (String, &'static str, &'static str) {
    let (verbs, nouns) = (profile.verbs.len(), profile.nouns.len());
    let plain = verbs * nouns;
    let within = i % plain;
    // Verb-major but diagonal, so the first tools do not all share one noun: (a, b) ->
    // (verb a, noun (a + b) mod nouns) is a bijection over the plain names.
    let (a, b) = (within % verbs, within / verbs);
    let verb = profile.verbs[a];
    let noun = profile.nouns[(a + b) % nouns];
    let sep = match profile.naming {
        Naming::Snake => "_",
        Naming::Api => "-",
    };
    let round = i / plain;
    let stem = match round {
        0 => format!("{verb}{sep}{noun}"),
        _ => {
            let area = profile.areas[(round - 1) % profile.areas.len()];
            match (round - 1) / profile.areas.len() {
                0 => format!("{area}{sep}{verb}{sep}{noun}"),
                n => format!("{area}{n}{sep}{verb}{sep}{noun}"),
            }
        }
    };
    let name = match profile.naming {
        Naming::Snake => stem,
        Naming::Api => format!("API-{stem}"),
    };
    (name, verb, noun)
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// The noun as words: `pull_request` -> `pull request`, `a-page` -> `page`.
fn words(noun: &str) -> String {
    noun.trim_start_matches("a-").replace(['_', '-'], " ")
}

fn description(
    kind: SyntheticKind,
    profile: &Profile,
    rng: &mut Rng,
    verb: &str,
    noun: &str,
    non_ascii: bool,
) -> String {
    let target = sample_length(rng, &profile.lengths);
    let n = words(noun);
    let mut text = match kind {
        SyntheticKind::Wiki => format!("Wiki | {} {}", capitalized(verb), noun.replace('-', " ")),
        _ if profile.scope.is_empty() => format!("{} {n}.", capitalized(verb)),
        _ => format!("{} {n} {}.", capitalized(verb), profile.scope),
    };
    if non_ascii {
        let extra = profile.non_ascii[rng.below(profile.non_ascii.len())];
        text.push_str(extra);
    }
    let mut next = rng.below(profile.sentences.len());
    // Wiki descriptions list their error responses in order, starting with the first.
    if kind == SyntheticKind::Wiki {
        next = 0;
    }
    let mut added = 0;
    while text.chars().count() < target && added < 3 * profile.sentences.len() {
        let sentence = profile.sentences[next % profile.sentences.len()]
            .replace("{n}", &n)
            .replace("{v}", verb);
        // Add a sentence only when it brings the length closer to the target.
        let len = text.chars().count();
        if (len + 1 + sentence.chars().count()).abs_diff(target) >= target.abs_diff(len) {
            break;
        }
        if !sentence.starts_with('\n') {
            text.push(' ');
        }
        text.push_str(&sentence);
        next += 1;
        added += 1;
    }
    text
}

fn scalar(kind: &str, description: &str) -> Value {
    let mut value = json!({ "type": kind });
    if !description.is_empty() {
        value["description"] = Value::from(description);
    }
    if kind == "integer" {
        value["minimum"] = Value::from(1);
    }
    value
}

/// A property `depth` levels deep (1: a scalar; 2: an array of strings; 3: an array of
/// objects; 4: an array of objects holding an array of strings).
fn nested(noun: &str, depth: usize) -> (String, Value) {
    let n = words(noun);
    match depth {
        0 | 1 => ("note".into(), scalar("string", "A short note.")),
        2 => (
            "labels".into(),
            json!({"type": "array", "items": {"type": "string"}, "description": format!("Labels to set on the {n}."), "uniqueItems": true}),
        ),
        3 => (
            "filters".into(),
            json!({
                "type": "array",
                "description": format!("Conditions the {n} must all meet."),
                "items": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string"},
                        "op": {"type": "string", "description": "eq, ne, lt, gt or contains"},
                        "value": {"type": ["string", "number", "boolean"]}
                    },
                    "required": ["field", "op", "value"],
                    "additionalProperties": false
                },
                "maxItems": 10
            }),
        ),
        _ => (
            noun.replace('-', "_"),
            json!({
                "type": "array",
                "description": format!("The {n} to write, several at once."),
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": format!("The name of the {n}")},
                        "kind": {"type": "string", "description": format!("The type of the {n}")},
                        "contents": {"type": "array", "items": {"type": "string"}, "description": "Its contents, one entry per line"}
                    },
                    "required": ["name", "kind", "contents"]
                }
            }),
        ),
    }
}

/// Definitions as notion's schemas carry them: rich text, a parent that is one of several
/// shapes, a sort, a filter (depth 3 measured from their own root).
fn definitions(noun: &str, rng: &mut Rng) -> (JsonObject, Vec<(String, Value)>) {
    let n = words(noun);
    let mut defs = JsonObject::new();
    defs.insert(
        "richTextRequest".into(),
        json!({
            "type": "object",
            "properties": {
                "text": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string"},
                        "link": {"type": ["object", "null"]}
                    },
                    "required": ["content"],
                    "additionalProperties": false
                },
                "type": {"type": "string", "enum": ["text"]}
            },
            "required": ["text"],
            "additionalProperties": false
        }),
    );
    defs.insert(
        "pageIdParentRequest".into(),
        json!({"type": "object", "properties": {"page_id": {"type": "string", "format": "uuid"}}, "required": ["page_id"]}),
    );
    defs.insert(
        "parentRequest".into(),
        json!({"oneOf": [
            {"$ref": "#/$defs/pageIdParentRequest"},
            {"type": "object", "properties": {"type": {"const": "workspace"}}, "required": ["type"]}
        ]}),
    );
    let mut props = vec![
        (
            "parent".to_owned(),
            json!({"$ref": "#/$defs/parentRequest"}),
        ),
        (
            "title".to_owned(),
            json!({"type": "array", "items": {"$ref": "#/$defs/richTextRequest"}, "description": format!("The {n}'s title as rich text.")}),
        ),
    ];
    if rng.per_mille(500) {
        defs.insert(
            "sortObject".into(),
            json!({
                "type": "object",
                "properties": {
                    "property": {"type": "string"},
                    "direction": {"type": "string", "enum": ["ascending", "descending"]}
                },
                "required": ["property", "direction"]
            }),
        );
        props.push((
            "sorts".into(),
            json!({"type": "array", "items": {"$ref": "#/$defs/sortObject"}, "maxItems": 100}),
        ));
    }
    if rng.per_mille(400) {
        defs.insert(
            "iconRequest".into(),
            json!({"anyOf": [
                {"type": "object", "properties": {"emoji": {"type": "string"}, "type": {"const": "emoji"}}, "required": ["emoji"]},
                {"type": "object", "properties": {"external": {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}, "required": ["url"]}}, "required": ["external"]},
                {"type": "null"}
            ]}),
        );
        props.push(("icon".into(), json!({"$ref": "#/$defs/iconRequest"})));
    }
    (defs, props)
}

fn tool(kind: SyntheticKind, i: usize) -> Option<ToolDefinition> {
    let profile = kind.profile();
    let mut rng = Rng::new(kind, i);
    let (name, verb, noun) = name(profile, i);
    let non_ascii = !profile.non_ascii.is_empty() && rng.per_mille(profile.non_ascii_share);
    let description = description(kind, profile, &mut rng, verb, noun, non_ascii);
    let depth = rng.weighted(&profile.depths);
    let use_ref = rng.per_mille(profile.ref_share);
    let use_any_of = rng.per_mille(profile.any_of_share);
    let use_enum = rng.per_mille(profile.enum_share);

    let mut properties = JsonObject::new();
    let mut required = Vec::new();
    let mut defs = JsonObject::new();
    if depth > 0 || use_ref || use_any_of || use_enum {
        for (prop, ty, text) in profile.base {
            properties.insert((*prop).into(), scalar(ty, text));
            required.push(Value::from(*prop));
        }
        let extra = profile.extra_props + rng.below(profile.extra_props_spread + 1);
        for _ in 0..extra {
            let (prop, ty, text) = SCALARS[rng.below(SCALARS.len())];
            properties.insert(prop.into(), scalar(ty, text));
        }
        if depth >= 2 {
            let (prop, value) = nested(noun, depth);
            properties.insert(prop, value);
        } else if depth == 1 && properties.is_empty() {
            properties.insert("query".into(), scalar("string", "What to look for."));
        }
    }
    if use_enum {
        let (prop, text, values) = ENUMS[rng.below(ENUMS.len())];
        properties.insert(
            prop.into(),
            json!({"type": "string", "description": text, "enum": values}),
        );
    }
    if use_any_of && !use_ref {
        properties.insert(
            "assignee_or_team".into(),
            json!({"anyOf": [
                {"type": "string", "description": "A login"},
                {"type": "integer", "description": "A team id", "minimum": 1},
                {"type": "null"}
            ]}),
        );
    }
    if use_ref {
        let (d, props) = definitions(noun, &mut rng);
        defs = d;
        for (prop, value) in props {
            properties.insert(prop, value);
        }
    }
    if non_ascii && kind == SyntheticKind::Forge {
        properties.insert(
            "field_names".into(),
            json!({"type": "array", "items": {"type": "string"}, "description": "Field names, e.g. [\"Status\"]. Resolved server-side to field IDs — pass this or 'fields', not both."}),
        );
    }
    let mut schema = JsonObject::new();
    if let Some(uri) = profile.schema_uri {
        schema.insert("$schema".into(), Value::from(uri));
    }
    if !defs.is_empty() {
        schema.insert("$defs".into(), Value::Object(defs));
    }
    schema.insert("type".into(), Value::from("object"));
    schema.insert("properties".into(), Value::Object(properties));
    if !required.is_empty() {
        schema.insert("required".into(), Value::Array(required));
    }

    // Names join fixed words of [a-z-], `_`/`-` separators, an optional number and an
    // optional `API-`, under 64 bytes: always valid (a test checks thousands of them per
    // kind); `filter_map` above keeps this panic-free regardless.
    let mut tool = ToolDefinition::new(ToolName::new(name).ok()?, description, schema);
    let read_only = matches!(
        verb,
        "list" | "get" | "search" | "read" | "open" | "retrieve" | "query" | "export" | "download"
    );
    let title = format!("{} {}", capitalized(verb), capitalized(&words(noun)));
    if profile.title {
        tool.title = Some(title.clone());
    }
    tool.annotations = Some(ToolAnnotations {
        title: (!profile.title && kind != SyntheticKind::Wiki).then_some(title),
        read_only_hint: Some(read_only),
        destructive_hint: (!read_only).then_some(verb == "delete"),
        open_world_hint: Some(matches!(kind, SyntheticKind::Forge | SyntheticKind::Suite)),
        ..ToolAnnotations::default()
    });
    if profile.output_schema {
        let mut output = JsonObject::new();
        if let Some(uri) = profile.schema_uri {
            output.insert("$schema".into(), Value::from(uri));
        }
        output.insert("type".into(), Value::from("object"));
        output.insert(
            "properties".into(),
            json!({"content": {"type": "string"}, "count": {"type": "integer"}}),
        );
        output.insert("required".into(), json!(["content"]));
        output.insert("additionalProperties".into(), Value::from(false));
        tool.output_schema = Some(output);
    }
    Some(tool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_valid_and_stable() {
        for kind in SyntheticKind::ALL {
            let tools = synthetic_catalog(kind, 3_000);
            assert_eq!(tools.len(), 3_000, "{kind:?}");
            let names: HashSet<_> = tools.iter().map(|t| t.name.as_str().to_owned()).collect();
            assert_eq!(names.len(), 3_000, "{kind:?}");
            for name in &names {
                assert!(
                    name.len() <= 64
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                    "{name} is not a provider function name"
                );
            }
        }
        let suite = synthetic_tools(300);
        assert_eq!(suite[0].name.as_str(), "list_customers");
        assert_eq!(suite[1].name.as_str(), "get_deal");
        assert_eq!(suite[200].name.as_str(), "crm_list_customers");
        assert_eq!(
            synthetic_catalog(SyntheticKind::Wiki, 1)[0].name.as_str(),
            "API-retrieve-a-page"
        );
        assert_eq!(synthetic_tools(5), synthetic_tools(5));
        // A smaller catalogue is a prefix of a larger one.
        assert_eq!(synthetic_tools(40)[..], suite[..40]);
    }

    #[test]
    fn kinds_have_their_own_vocabulary() {
        let first: Vec<String> = SyntheticKind::ALL
            .iter()
            .map(|kind| {
                synthetic_catalog(*kind, 9)
                    .iter()
                    .map(|t| t.name.as_str().to_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        let distinct: HashSet<&String> = first.iter().collect();
        assert_eq!(distinct.len(), first.len(), "{first:#?}");
        for kind in SyntheticKind::ALL {
            assert_eq!(SyntheticKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(SyntheticKind::from_name("nope"), None);
    }
}
