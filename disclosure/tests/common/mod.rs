//! What the disclosure tests share: the real catalogues of `shared/fixtures/catalogs`, a
//! bytes/4 token estimator standing in for psych-elision's, and builders of inputs.

#![allow(
    dead_code,
    reason = "each test file uses a different part of the helpers"
)]

pub(crate) mod bm25;

use std::path::PathBuf;

use psych_disclosure::{Inputs, Settings, Surface, resolve};
use psych_types::{
    CatalogVersion, ConnectionSpec, PermissionGrant, Preload, Reachability, ServerCatalog,
    ServerHealth, ServerId, SyncStamp, TokenEstimator, ToolDefinition, ToolList,
};

/// Four bytes a token, rounded up: a test stand-in for psych-elision's estimator (the
/// runtime plugs the real one in). Monotone, as the seam requires.
pub(crate) struct Bytes4;

impl TokenEstimator for Bytes4 {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len().div_ceil(4) as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len.div_ceil(4)
    }
}

/// The `shared/fixtures/catalogs` folder beside the checkout (or `$PSYCH_FIXTURES/catalogs`).
pub(crate) fn catalogs_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PSYCH_FIXTURES") {
        return PathBuf::from(dir).join("catalogs");
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|dir| dir.join("shared/fixtures/catalogs"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no shared/fixtures/catalogs above {}", manifest.display()))
}

/// The five distinct fixture catalogues (the `.full` GitHub variant is the same tools),
/// by the server name each is connected as.
pub(crate) const FIXTURES: [(&str, &str); 5] = [
    ("github", "github.tools.json"),
    ("notion", "notion.tools.json"),
    ("playwright", "playwright.tools.json"),
    ("filesystem", "server-filesystem.tools.json"),
    ("memory", "server-memory.tools.json"),
];

/// One fixture's tools, sorted by name.
pub(crate) fn fixture_tools(file: &str) -> Vec<ToolDefinition> {
    let text = std::fs::read_to_string(catalogs_dir().join(file)).unwrap();
    let mut list: ToolList = serde_json::from_str(&text).unwrap();
    list.tools.sort_by(|a, b| a.name.cmp(&b.name));
    list.tools
}

/// A catalogue at version 1, listed and reachable.
pub(crate) fn catalog(server: &str, tools: Vec<ToolDefinition>) -> ServerCatalog {
    ServerCatalog {
        server: ServerId::new(server).unwrap(),
        version: CatalogVersion(1),
        tools: tools.into(),
        health: ServerHealth {
            last_sync: Some(SyncStamp {
                version: CatalogVersion(1),
                at: 1_796_000_000_000,
            }),
            last_error: None,
            reachability: Reachability::Reachable,
        },
    }
}

/// The descriptions the fixture servers are connected with.
pub(crate) fn description(server: &str) -> &'static str {
    match server {
        s if s.starts_with("github") => {
            "GitHub: repositories, issues, pull requests, actions, code security and notifications."
        }
        s if s.starts_with("notion") => "Notion workspace pages, blocks, databases and comments.",
        s if s.starts_with("playwright") => "A real browser driven by Playwright.",
        s if s.starts_with("filesystem") => "Files and directories under the allowed roots.",
        _ => "A knowledge graph of entities, relations and observations kept across sessions.",
    }
}

/// Everything a resolution needs, owned.
pub(crate) struct Setup {
    pub(crate) connections: Vec<ConnectionSpec>,
    pub(crate) catalogs: Vec<ServerCatalog>,
    pub(crate) grant: PermissionGrant,
}

impl Setup {
    /// The inputs view.
    pub(crate) fn inputs(&self) -> Inputs<'_> {
        Inputs {
            connections: &self.connections,
            catalogs: &self.catalogs,
            grant: &self.grant,
        }
    }

    /// The state-now view for the guard.
    pub(crate) fn live(&self) -> psych_disclosure::Live<'_> {
        psych_disclosure::Live {
            grant: &self.grant,
            catalogs: &self.catalogs,
        }
    }

    /// No server.
    pub(crate) fn empty() -> Self {
        Self {
            connections: Vec::new(),
            catalogs: Vec::new(),
            grant: PermissionGrant::none(),
        }
    }

    /// Adds the server of `connection` with its catalogue of `tools`, every tool granted.
    pub(crate) fn add(&mut self, connection: ConnectionSpec, tools: Vec<ToolDefinition>) {
        let id = connection.server.clone();
        self.catalogs.push(catalog(id.as_str(), tools));
        self.connections.push(connection);
        self.grant = std::mem::take(&mut self.grant).allow_server(id);
    }

    /// Resolves with `settings` and the bytes/4 estimator.
    pub(crate) fn resolve(&self, settings: &Settings) -> Surface {
        resolve(&self.inputs(), settings, &Bytes4).unwrap()
    }
}

/// The five fixture servers, each with every tool granted and the given preload.
pub(crate) fn fixture_setup(preload: Preload) -> Setup {
    named_setup(FIXTURES.iter().map(|(s, f)| (s.to_string(), *f)), preload)
}

/// Servers named as given, with the given fixture's tools, every tool granted.
pub(crate) fn named_setup(
    servers: impl IntoIterator<Item = (String, &'static str)>,
    preload: Preload,
) -> Setup {
    let mut setup = Setup::empty();
    for (server, file) in servers {
        let id = ServerId::new(server.as_str()).unwrap();
        setup.add(
            ConnectionSpec::new(id)
                .with_description(description(&server))
                .with_preload(preload),
            fixture_tools(file),
        );
    }
    setup
}

/// A 1,000+ tool setup: the five fixtures (six catalogues counting GitHub's `.full`
/// variant) replicated under several server names.
pub(crate) fn large_setup(copies: usize, preload: Preload) -> Setup {
    let files = [
        ("github", "github.tools.json"),
        ("githubfull", "github.tools.full.json"),
        ("notion", "notion.tools.json"),
        ("playwright", "playwright.tools.json"),
        ("filesystem", "server-filesystem.tools.json"),
        ("memory", "server-memory.tools.json"),
    ];
    named_setup(
        (0..copies).flat_map(|i| {
            files
                .iter()
                .map(move |(server, file)| (format!("{server}-{i}"), *file))
        }),
        preload,
    )
}

/// The bytes a provider is sent for one tool, in the Anthropic shape
/// `{"name":…,"description":…,"input_schema":…}` (what prompt assembly renders).
pub(crate) fn tool_bytes(tool: &ToolDefinition) -> usize {
    let value = serde_json::json!({
        "name": tool.name.as_str(),
        "description": tool.description_or_empty(),
        "input_schema": tool.input_schema,
    });
    serde_json::to_string(&value).unwrap().len()
}

/// The prompt bytes of a Surface: every tool as sent plus every deferred line.
pub(crate) fn surface_bytes(surface: &Surface) -> usize {
    surface.tools().iter().map(tool_bytes).sum::<usize>()
        + surface
            .deferred_lines()
            .iter()
            .map(|l| l.len() + 1)
            .sum::<usize>()
}
