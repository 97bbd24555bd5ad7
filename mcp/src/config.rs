//! The `mcpServers` configuration file, as Claude Desktop, Claude Code and Cursor write it,
//! plus Psych's own optional keys per server.
//!
//! A file is one JSON object with an `mcpServers` object inside; each entry names a server
//! and says how to reach it:
//!
//! - stdio: `command` (required), `args`, `env`, `cwd`;
//! - streamable HTTP: `url` (required), `headers`;
//! - `type` is optional (`"stdio"`, `"http"`, `"streamable-http"`, `"streamableHttp"`); without
//!   it, `command` means stdio and `url` means HTTP.
//!
//! Psych's keys, all optional: `preload` (`true` always injects the server's schemas,
//! `false` always defers them, absent decides from the catalogue size), `eagerTools` (tool
//! names injected even when the server is deferred) and `description` (the short line shown
//! for a deferred server); `allowTools` (the tools the grant permits), `output` (per
//! server and tool output limits, [`OUTPUT`]), and `lazy`,
//! `listingTtlSecs` and `idleSecs` ([`StartPolicy`]: whether and how a server is started only
//! when it is needed), kept in [`ServerConfig::extra`] and read by their accessors. Keys
//! nobody here knows are kept there too, and keys beside `mcpServers` in
//! [`McpConfig::extra`], never rejected: the file is shared with other clients. Two
//! exceptions, so that a grant fails closed: a key that spells one of Psych's otherwise
//! (`allowedTools`, `AllowTools`), or another client's key narrowing a server's tools
//! (Gemini CLI's `includeTools`, `excludeTools`, Roo Code's `disabledTools`; an empty list
//! of tools to leave out narrows nothing and is kept), is refused
//! ([`ConfigError::UnreadKey`]);
//! and an entry with `"disabled": true` (Cline, Roo Code, Windsurf) is left out
//! ([`McpConfig::disabled`]).
//!
//! `${VAR}` and `${VAR:-default}` in `command`, `args`, `env`, `cwd`, `url` and `headers`
//! expand from the environment when the file is parsed, as the common clients do, so no
//! secret has to sit in the file. `$` not followed by `{` is kept as it is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use psych_types::{
    ConnectionSpec, JsonObject, OutputLimit, OutputLimits, PermissionGrant, Preload, ServerId,
    ToolName, ToolRef,
};
use serde_json::Value;

/// Why a configuration file was refused. Every variant about one server names it and the
/// field at fault, so a person can find the line to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read MCP config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A server entry has a key that would narrow or stop the server in another spelling
    /// (`allowedTools` for [`ALLOW_TOOLS`], `AllowTools`) or in another client's dialect
    /// (Gemini CLI's `includeTools`, `excludeTools`): Psych does not read it, so the
    /// server would be granted whole. Refused rather than ignored: a grant fails closed.
    #[error(
        "MCP config: server {server:?} has the key {key:?}, which Psych does not read: {advice}"
    )]
    UnreadKey {
        /// The server's name in the file.
        server: String,
        /// The key as written.
        key: String,
        /// What to write instead.
        advice: String,
    },
    /// The text is not JSON.
    #[error("MCP config is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The document is not an object with an `mcpServers` object inside.
    #[error("MCP config must be a JSON object with an \"mcpServers\" object: {0}")]
    Shape(&'static str),
    /// An object within `mcpServers` (or the document, for `mcpServers` itself) gives one
    /// key twice: JSON readers keep one of the two (serde and `JSON.parse` the last), so
    /// the other (a server's entry, its `allowTools`) would be dropped without a word. Keys
    /// repeated elsewhere in the file (a client's own settings) are that client's.
    #[error("MCP config: {path} is given twice; keep one of the two")]
    RepeatedKey {
        /// Where: the keys from the top down to the repeated one (`mcpServers.github`).
        path: String,
    },
    /// A server's name is not a valid server id.
    #[error("MCP config: server name {name:?} is not usable: {source}")]
    ServerName {
        /// The name as written.
        name: String,
        /// Why it was refused.
        source: psych_types::IdError,
    },
    /// One field of one server is wrong.
    #[error("MCP config: server {server:?}, field {field:?}: {problem}")]
    Field {
        /// The server, as named in the file.
        server: String,
        /// The field at fault (`args[2]`, `env.TOKEN`, `type`, …).
        field: String,
        /// What is wrong, and what is expected instead.
        problem: String,
    },
}

/// A parsed `mcpServers` file: every server, ordered by name.
#[derive(Debug, Clone, PartialEq)]
pub struct McpConfig {
    /// The servers, by name.
    pub servers: BTreeMap<ServerId, ServerConfig>,
    /// Keys beside `mcpServers`, kept as they were.
    pub extra: JsonObject,
    /// The names of the entries left out because they say `"disabled": true` (as Cline,
    /// Roo Code and Windsurf write a server turned off), in name order.
    pub disabled: Vec<String>,
}

/// One server of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// How to reach it.
    pub transport: Transport,
    /// What disclosure needs: the preload flag, eager tools, the short description.
    pub connection: ConnectionSpec,
    /// Keys of the entry that neither MCP clients' common format nor Psych names, kept.
    pub extra: JsonObject,
}

/// How to reach a server, with every `${VAR}` already expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on its standard input and output.
    Stdio {
        /// The program to run.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to the inherited environment.
        env: BTreeMap<String, String>,
        /// The working directory, when given.
        cwd: Option<PathBuf>,
    },
    /// A remote server over streamable HTTP.
    Http {
        /// The endpoint.
        url: String,
        /// Headers sent with every request (authorization, usually).
        headers: BTreeMap<String, String>,
    },
}

/// The key of a server entry that narrows its grant to the tools it names (a list of tool
/// names): Psych's own, kept in [`ServerConfig::extra`] (other clients reading the same file
/// ignore it) and read by [`ServerConfig::allowed_tools`] and [`McpConfig::grant`].
pub const ALLOW_TOOLS: &str = "allowTools";

impl ServerConfig {
    /// The tools this server's [`ALLOW_TOOLS`] entry names, or `None` when it has none (every
    /// tool of the server is permitted).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Field`] when the entry is not a list of tool names, naming the server
    /// of [`ServerConfig::connection`] (for a parsed file, its name in the file).
    /// [`McpConfig::parse`] checks every entry, so a parsed file never fails.
    pub fn allowed_tools(
        &self,
    ) -> Result<Option<std::collections::BTreeSet<ToolName>>, ConfigError> {
        let error = |field: String, problem: String| ConfigError::Field {
            server: self.connection.server.as_str().to_owned(),
            field,
            problem,
        };
        let Some(value) = self.extra.get(ALLOW_TOOLS) else {
            return Ok(None);
        };
        let Value::Array(names) = value else {
            return Err(error(
                ALLOW_TOOLS.to_owned(),
                "expected a list of tool names".to_owned(),
            ));
        };
        let mut tools = std::collections::BTreeSet::new();
        for (i, name) in names.iter().enumerate() {
            let field = format!("{ALLOW_TOOLS}[{i}]");
            let Value::String(name) = name else {
                return Err(error(field, "expected a tool name (a string)".to_owned()));
            };
            let tool = ToolName::new(name.as_str()).map_err(|e| error(field, e.to_string()))?;
            tools.insert(tool);
        }
        Ok(Some(tools))
    }
}

/// The key of a server entry that sets its results' output limits: Psych's own, kept in
/// [`ServerConfig::extra`] and read by [`ServerConfig::output_limit`] and
/// [`McpConfig::output_limits`]. An object with any of `perResultTokens` (a successful
/// result of this many estimated tokens or more is elided, at least 1), `headChars` and
/// `tailChars` (the preview's sizes), and `tools`, an object from tool names to objects of
/// the same three keys: `{"perResultTokens": 2000, "tools": {"search": {"headChars":
/// 4000}}}`. A tool's setting beats its server's, which beats a hint the server declares in
/// the tool's `_meta` (`anthropic/maxResultSizeChars`), which beats the defaults.
pub const OUTPUT: &str = "output";

impl ServerConfig {
    /// What this server's [`OUTPUT`] entry sets: for the server, and per tool (empty when it
    /// has none).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Field`] naming the key at fault (`output.tools.search.headChars`) for
    /// an entry of the wrong shape, an unknown key, or a `perResultTokens` of 0.
    /// [`McpConfig::parse`] checks every entry, so a parsed file never fails.
    pub fn output_limit(
        &self,
    ) -> Result<(OutputLimit, BTreeMap<ToolName, OutputLimit>), ConfigError> {
        let error = |field: String, problem: String| ConfigError::Field {
            server: self.connection.server.as_str().to_owned(),
            field,
            problem,
        };
        let Some(value) = self.extra.get(OUTPUT).filter(|v| !v.is_null()) else {
            return Ok((OutputLimit::default(), BTreeMap::new()));
        };
        let Value::Object(entry) = value else {
            return Err(error(
                OUTPUT.to_owned(),
                "expected an object with perResultTokens, headChars, tailChars or tools".to_owned(),
            ));
        };
        let mut entry = entry.clone();
        let tools = entry.remove("tools");
        // Each key read by hand, so an error names it (`output.tools.search.headChars`).
        let limit = |at: String, object: JsonObject| -> Result<OutputLimit, ConfigError> {
            let mut limit = OutputLimit::default();
            for (key, value) in object {
                let field = format!("{at}.{key}");
                let number = match &value {
                    Value::Null => None,
                    Value::Number(n) => Some(n.as_u64().ok_or_else(|| {
                        error(
                            field.clone(),
                            "expected a whole number, 0 or more".to_owned(),
                        )
                    })?),
                    _ => {
                        return Err(error(field, "expected a whole number".to_owned()));
                    }
                };
                match key.as_str() {
                    "perResultTokens" => {
                        if number == Some(0) {
                            return Err(error(
                                field,
                                "expected at least 1 (0 would elide every result)".to_owned(),
                            ));
                        }
                        limit.per_result_tokens = number;
                    }
                    "headChars" => {
                        limit.head_chars = number.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
                    }
                    "tailChars" => {
                        limit.tail_chars = number.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
                    }
                    _ => {
                        return Err(error(
                            field,
                            "unknown key: expected perResultTokens, headChars or tailChars"
                                .to_owned(),
                        ));
                    }
                }
            }
            Ok(limit)
        };
        let server = limit(OUTPUT.to_owned(), entry)?;
        let mut per_tool = BTreeMap::new();
        match tools {
            None | Some(Value::Null) => {}
            Some(Value::Object(tools)) => {
                for (name, value) in tools {
                    let at = format!("{OUTPUT}.tools.{name}");
                    let tool = ToolName::new(name.as_str())
                        .map_err(|e| error(at.clone(), e.to_string()))?;
                    let Value::Object(object) = value else {
                        return Err(error(
                            at,
                            "expected an object with perResultTokens, headChars or tailChars"
                                .to_owned(),
                        ));
                    };
                    per_tool.insert(tool, limit(at, object)?);
                }
            }
            Some(_) => {
                return Err(error(
                    format!("{OUTPUT}.tools"),
                    "expected an object from tool names to limits".to_owned(),
                ));
            }
        }
        Ok((server, per_tool))
    }
}

/// The key of a server entry that says whether the server is started only when it is
/// needed (`true`, the default, or `false`): Psych's own, kept in [`ServerConfig::extra`] and
/// read by [`ServerConfig::start_policy`].
pub const LAZY: &str = "lazy";
/// The key of a server entry giving, in seconds, how old its kept listing may be for the
/// server to be known without being started ([`StartPolicy::listing_ttl`]).
pub const LISTING_TTL_SECS: &str = "listingTtlSecs";
/// The key of a server entry giving, in seconds, how long a server started on demand runs
/// without a request before it is stopped ([`StartPolicy::idle`]).
pub const IDLE_SECS: &str = "idleSecs";

/// How a server is started: on demand while its kept listing is fresh enough, or at once.
/// Read from an entry's [`LAZY`], [`LISTING_TTL_SECS`] and [`IDLE_SECS`] keys by
/// [`ServerConfig::start_policy`]; what a program does with it is its own (`psych serve`
/// starts a lazy server whose kept listing is younger than `listing_ttl` only at its first
/// call, and every other server at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartPolicy {
    /// Whether the server may be started on demand (the entry's `lazy`, default `true`).
    pub lazy: bool,
    /// How old a kept listing may be for the server to be known without starting it
    /// (default [`StartPolicy::DEFAULT_LISTING_TTL`]); past it, the server is started to be
    /// listed again.
    pub listing_ttl: std::time::Duration,
    /// How long the server runs without a request once started on demand (default
    /// [`StartPolicy::DEFAULT_IDLE`]).
    pub idle: std::time::Duration,
}

impl StartPolicy {
    /// A kept listing serves for 7 days without a start.
    pub const DEFAULT_LISTING_TTL: std::time::Duration =
        std::time::Duration::from_secs(7 * 24 * 3600);
    /// A server started on demand stops after 5 minutes without a request.
    pub const DEFAULT_IDLE: std::time::Duration = std::time::Duration::from_secs(300);
    /// The most seconds `listingTtlSecs` and `idleSecs` take: a year.
    pub const MAX_SECS: u64 = 365 * 24 * 3600;
}

impl Default for StartPolicy {
    fn default() -> Self {
        Self {
            lazy: true,
            listing_ttl: Self::DEFAULT_LISTING_TTL,
            idle: Self::DEFAULT_IDLE,
        }
    }
}

impl ServerConfig {
    /// How this server is to be started, from its [`LAZY`], [`LISTING_TTL_SECS`] and
    /// [`IDLE_SECS`] keys (each optional: [`StartPolicy::default`] for the ones absent).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Field`] for a `lazy` that is not a boolean, or a number of seconds
    /// that is not a whole number from 1 to [`StartPolicy::MAX_SECS`]. [`McpConfig::parse`]
    /// checks every entry, so a parsed file never fails.
    pub fn start_policy(&self) -> Result<StartPolicy, ConfigError> {
        let error = |field: &str, problem: &str| ConfigError::Field {
            server: self.connection.server.as_str().to_owned(),
            field: field.to_owned(),
            problem: problem.to_owned(),
        };
        let mut policy = StartPolicy::default();
        match self.extra.get(LAZY) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(lazy)) => policy.lazy = *lazy,
            Some(_) => {
                return Err(error(
                    LAZY,
                    "expected true (start the server at its first call while its kept listing \
                     is fresh) or false (start it at once)",
                ));
            }
        }
        let seconds = |key: &str| -> Result<Option<std::time::Duration>, ConfigError> {
            let secs = match self.extra.get(key) {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::Number(n)) => n.as_u64(),
                Some(_) => None,
            };
            match secs {
                Some(secs @ 1..=StartPolicy::MAX_SECS) => {
                    Ok(Some(std::time::Duration::from_secs(secs)))
                }
                _ => Err(error(
                    key,
                    &format!(
                        "expected a whole number of seconds from 1 to {} (a year)",
                        StartPolicy::MAX_SECS
                    ),
                )),
            }
        };
        if let Some(ttl) = seconds(LISTING_TTL_SECS)? {
            policy.listing_ttl = ttl;
        }
        if let Some(idle) = seconds(IDLE_SECS)? {
            policy.idle = idle;
        }
        Ok(policy)
    }
}

impl McpConfig {
    /// The output limits the file sets ([`OUTPUT`] of each entry), without hints (an elider's
    /// owner takes them from the catalogues: [`OutputLimits::with_hints`]).
    ///
    /// # Errors
    ///
    /// As [`ServerConfig::output_limit`] (never for a file [`McpConfig::parse`] accepted).
    pub fn output_limits(&self) -> Result<OutputLimits, ConfigError> {
        let mut limits = OutputLimits::new();
        for (server, entry) in &self.servers {
            let (own, tools) = entry.output_limit()?;
            if !own.is_empty() {
                limits = limits.server(server.clone(), own);
            }
            for (tool, limit) in tools {
                limits = limits.tool(ToolRef::new(server.clone(), tool), limit);
            }
        }
        Ok(limits)
    }

    /// The permission grant the file gives: every tool of a server without
    /// [`ALLOW_TOOLS`], the tools it names for a server with it. The one grant builder:
    /// `psych serve` and `psych budget` both decide with it, so one file gives one Surface.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Field`] for an [`ALLOW_TOOLS`] entry that is not a list of tool names
    /// (never for a file [`McpConfig::parse`] accepted).
    pub fn grant(&self) -> Result<PermissionGrant, ConfigError> {
        let mut grant = PermissionGrant::none();
        for (server, entry) in &self.servers {
            match entry.allowed_tools()? {
                None => grant = grant.allow_server(server.clone()),
                Some(tools) => {
                    for tool in tools {
                        grant = grant.allow_tool(ToolRef::new(server.clone(), tool));
                    }
                }
            }
        }
        Ok(grant)
    }
}

/// The keys this module reads from a server entry; anything else goes to `extra`.
const KNOWN_KEYS: [&str; 10] = [
    "type",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "preload",
    "eagerTools",
    "description",
];

/// The key of a server entry that turns it off (Cline's, Roo Code's, Windsurf's): an entry
/// with `"disabled": true` is left out of [`McpConfig::servers`] and named in
/// [`McpConfig::disabled`], as those clients leave it out.
pub const DISABLED: &str = "disabled";

/// Psych's own keys of a server entry, read from [`ServerConfig::extra`].
const PSYCH_KEYS: [&str; 5] = [ALLOW_TOOLS, OUTPUT, LAZY, LISTING_TTL_SECS, IDLE_SECS];

/// Why Psych refuses an entry's `key` it would otherwise keep unread, if it does: a
/// spelling of one of its own keys other than its own (compared ignoring case, `_` and
/// `-`; `allowedTools` for [`ALLOW_TOOLS`]), or another client's key that narrows a
/// server's tools, which Psych does not read (the server would be granted whole), unless
/// its `value` narrows nothing (an empty `excludeTools` or `disabledTools`).
fn unread(key: &str, value: &Value) -> Option<String> {
    if PSYCH_KEYS.contains(&key) {
        return None;
    }
    let fold = |key: &str| -> String {
        key.chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .map(|c| c.to_ascii_lowercase())
            .collect()
    };
    let folded = fold(key);
    let meant = KNOWN_KEYS
        .iter()
        .chain(&PSYCH_KEYS)
        .find(|known| fold(known) == folded)
        .copied()
        .or((folded == "allowedtools").then_some(ALLOW_TOOLS));
    if let Some(meant) = meant {
        return Some(format!("did you mean {meant:?}? Keys are case-sensitive"));
    }
    let leaves_out = matches!(folded.as_str(), "excludetools" | "disabledtools");
    if leaves_out && value.as_array().is_some_and(Vec::is_empty) {
        return None;
    }
    (leaves_out || matches!(folded.as_str(), "includetools" | "enabledtools")).then(|| {
        format!(
            "it narrows the server's tools in another client, and ignored it would leave the \
             server granted whole; name the tools to grant in {ALLOW_TOOLS:?} and remove it"
        )
    })
}

/// The largest configuration file read ([`McpConfig::load`], and `psych serve`'s tokens
/// file): far above any real one (a server's entry is a few hundred bytes), so a path to
/// something else (a log, `/dev/zero`, a FIFO that never ends) fails rather than fill
/// memory.
pub const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// Reads a configuration file's text, at most [`MAX_CONFIG_BYTES`] (blocks: a file read).
///
/// # Errors
///
/// The file's open or read failing; [`std::io::ErrorKind::FileTooLarge`] past the bound
/// (read no further than one byte past it, whatever the file is);
/// [`std::io::ErrorKind::InvalidData`] when it is not UTF-8.
pub fn read_config_text(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)?;
    // The size first: a large file that is not text is refused for its size.
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!("larger than {MAX_CONFIG_BYTES} bytes, the most a configuration file may be"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))
}

impl McpConfig {
    /// Reads and parses a file, expanding `${VAR}` from this process's environment.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] when the file cannot be read or is over [`MAX_CONFIG_BYTES`],
    /// else as [`McpConfig::parse`].
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = read_config_text(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, |name| std::env::var(name).ok())
    }

    /// Parses the text of a file, expanding `${VAR}` through `env` (a name to its value, or
    /// `None` when unset).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the server and field at fault; nothing is partly accepted.
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let document: Value = serde_json::from_str(text).map_err(ConfigError::Json)?;
        if let Some(path) = repeated_key(text) {
            return Err(ConfigError::RepeatedKey { path });
        }
        let Value::Object(mut top) = document else {
            return Err(ConfigError::Shape("the document is not an object"));
        };
        let servers = match top.remove("mcpServers") {
            Some(Value::Object(servers)) => servers,
            Some(_) => return Err(ConfigError::Shape("\"mcpServers\" is not an object")),
            None => return Err(ConfigError::Shape("there is no \"mcpServers\" key")),
        };
        let mut parsed = BTreeMap::new();
        let mut disabled = Vec::new();
        for (name, entry) in servers {
            match entry.get(DISABLED) {
                None | Some(Value::Bool(false) | Value::Null) => {}
                Some(Value::Bool(true)) => {
                    disabled.push(name);
                    continue;
                }
                Some(_) => {
                    return Err(ConfigError::Field {
                        server: name,
                        field: DISABLED.to_owned(),
                        problem: "expected true (the server is left out) or false".to_owned(),
                    });
                }
            }
            let server =
                ServerId::new(name.as_str()).map_err(|source| ConfigError::ServerName {
                    name: name.clone(),
                    source,
                })?;
            let config = Entry {
                name: &name,
                env: &env,
            }
            .parse(entry, server.clone())?;
            parsed.insert(server, config);
        }
        Ok(Self {
            servers: parsed,
            extra: top,
            disabled,
        })
    }
}

/// The path (`mcpServers.github`) of the first key an object of `text`'s `mcpServers`
/// gives twice (or `mcpServers` itself, given twice), if any; `text` is JSON (a second
/// pass over it: a map keeps one of a repeated key's values and cannot tell). The rest of
/// the file is its client's.
fn repeated_key(text: &str) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::cell::RefCell;

    /// Walks one value at `path`, noting in `found` the first repeated key.
    struct Walk<'a> {
        path: String,
        found: &'a RefCell<Option<String>>,
    }
    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
            deserializer.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut n = 0;
            while seq
                .next_element_seed(Walk {
                    path: format!("{}[{n}]", self.path),
                    found: self.found,
                })?
                .is_some()
            {
                n += 1;
            }
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut keys = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let path = if self.path.is_empty() {
                    key.clone()
                } else {
                    format!("{}.{key}", self.path)
                };
                // Within `mcpServers` only: the rest of a client's file (Claude Desktop's
                // own settings) is that client's to read.
                let ours = path == "mcpServers"
                    || path.starts_with("mcpServers.")
                    || path.starts_with("mcpServers[");
                if !keys.insert(key) && ours {
                    self.found.borrow_mut().get_or_insert(path.clone());
                }
                map.next_value_seed(Walk {
                    path,
                    found: self.found,
                })?;
            }
            Ok(())
        }
    }

    let found = RefCell::new(None);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    Walk {
        path: String::new(),
        found: &found,
    }
    .deserialize(&mut deserializer)
    .ok()?;
    found.into_inner()
}

/// One server entry being parsed: its name for error messages and the environment.
struct Entry<'a, E> {
    name: &'a str,
    env: &'a E,
}

impl<E: Fn(&str) -> Option<String>> Entry<'_, E> {
    fn error(&self, field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Field {
            server: self.name.to_owned(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn parse(&self, entry: Value, server: ServerId) -> Result<ServerConfig, ConfigError> {
        let Value::Object(mut entry) = entry else {
            return Err(self.error("", "a server entry must be a JSON object"));
        };
        let transport = self.transport(&mut entry)?;
        let mut connection = ConnectionSpec::new(server);
        connection.preload = match entry.remove("preload") {
            None | Some(Value::Null) => Preload::Auto,
            Some(Value::Bool(true)) => Preload::Eager,
            Some(Value::Bool(false)) => Preload::Deferred,
            Some(_) => {
                return Err(self.error(
                    "preload",
                    "expected true (always inject schemas), false (always defer) or no value (decide from the catalogue size)",
                ));
            }
        };
        if let Some(tools) = entry.remove("eagerTools") {
            for (i, name) in self.strings("eagerTools", tools)?.into_iter().enumerate() {
                let tool = ToolName::new(name)
                    .map_err(|e| self.error(format!("eagerTools[{i}]"), e.to_string()))?;
                connection.eager_tools.insert(tool);
            }
        }
        if let Some(description) = entry.remove("description") {
            connection.description = Some(self.string("description", description)?);
        }
        entry.retain(|key, _| !KNOWN_KEYS.contains(&key.as_str()));
        let unread = entry
            .iter()
            .find_map(|(key, value)| unread(key, value).map(|advice| (key, advice)));
        if let Some((key, advice)) = unread {
            return Err(ConfigError::UnreadKey {
                server: self.name.to_owned(),
                key: key.clone(),
                advice,
            });
        }
        let config = ServerConfig {
            transport,
            connection,
            extra: entry,
        };
        // Checked now, so a bad grant fails loading rather than the first command using it.
        config.allowed_tools()?;
        config.start_policy()?;
        config.output_limit()?;
        Ok(config)
    }

    fn transport(&self, entry: &mut JsonObject) -> Result<Transport, ConfigError> {
        let kind = match entry.get("type") {
            None | Some(Value::Null) => None,
            Some(Value::String(kind)) => Some(kind.as_str()),
            Some(_) => return Err(self.error("type", "expected a string")),
        };
        let stdio = match kind {
            Some("stdio") => true,
            Some("http" | "streamable-http" | "streamableHttp") => false,
            Some("sse") => {
                return Err(self.error(
                    "type",
                    "the legacy SSE transport is not supported; use the server's streamable HTTP endpoint with \"type\": \"http\"",
                ));
            }
            Some(other) => {
                return Err(self.error(
                    "type",
                    format!("unknown transport {other:?}; expected \"stdio\" or \"http\""),
                ));
            }
            None => match (entry.contains_key("command"), entry.contains_key("url")) {
                (true, false) => true,
                (false, true) => false,
                (true, true) => {
                    return Err(self.error(
                        "type",
                        "both \"command\" and \"url\" are given; say which with \"type\"",
                    ));
                }
                (false, false) => {
                    return Err(self.error(
                        "command",
                        "missing: a stdio server needs \"command\", a remote one \"url\"",
                    ));
                }
            },
        };
        if stdio {
            for key in ["url", "headers"] {
                if entry.contains_key(key) {
                    return Err(self.error(key, "not used by a stdio server"));
                }
            }
            let command = match entry.get("command") {
                Some(value) => self.expanded("command", value.clone())?,
                None => return Err(self.error("command", "missing: a stdio server needs one")),
            };
            if command.is_empty() {
                return Err(self.error("command", "is empty"));
            }
            let args = match entry.get("args") {
                None | Some(Value::Null) => Vec::new(),
                Some(args) => self
                    .strings("args", args.clone())?
                    .into_iter()
                    .enumerate()
                    .map(|(i, arg)| self.expand(&format!("args[{i}]"), &arg))
                    .collect::<Result<_, _>>()?,
            };
            let env = self.map("env", entry.get("env"))?;
            let cwd = match entry.get("cwd") {
                None | Some(Value::Null) => None,
                Some(cwd) => Some(PathBuf::from(self.expanded("cwd", cwd.clone())?)),
            };
            Ok(Transport::Stdio {
                command,
                args,
                env,
                cwd,
            })
        } else {
            for key in ["command", "args", "env", "cwd"] {
                if entry.contains_key(key) {
                    return Err(self.error(key, "not used by a remote (HTTP) server"));
                }
            }
            let url = match entry.get("url") {
                Some(value) => self.expanded("url", value.clone())?,
                None => return Err(self.error("url", "missing: a remote server needs one")),
            };
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(self.error("url", format!("{url:?} is not an http(s) URL")));
            }
            let headers = self.map("headers", entry.get("headers"))?;
            Ok(Transport::Http { url, headers })
        }
    }

    fn string(&self, field: &str, value: Value) -> Result<String, ConfigError> {
        match value {
            Value::String(text) => Ok(text),
            _ => Err(self.error(field, "expected a string")),
        }
    }

    fn expanded(&self, field: &str, value: Value) -> Result<String, ConfigError> {
        let text = self.string(field, value)?;
        self.expand(field, &text)
    }

    fn strings(&self, field: &str, value: Value) -> Result<Vec<String>, ConfigError> {
        let Value::Array(items) = value else {
            return Err(self.error(field, "expected an array of strings"));
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| self.string(&format!("{field}[{i}]"), item))
            .collect()
    }

    fn map(
        &self,
        field: &str,
        value: Option<&Value>,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        match value {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(key, value)| {
                    let field = format!("{field}.{key}");
                    let value = self.expanded(&field, value.clone())?;
                    Ok((key.clone(), value))
                })
                .collect(),
            Some(_) => Err(self.error(field, "expected an object of strings")),
        }
    }

    /// Expands `${VAR}` and `${VAR:-default}` in `text`.
    fn expand(&self, field: &str, text: &str) -> Result<String, ConfigError> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                return Err(self.error(field, "\"${\" without a closing \"}\""));
            };
            let inner = &after[..end];
            let (name, default) = match inner.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (inner, None),
            };
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(self.error(
                    field,
                    format!("\"${{{inner}}}\" does not name an environment variable"),
                ));
            }
            match ((self.env)(name), default) {
                (Some(value), _) => out.push_str(&value),
                (None, Some(default)) => out.push_str(default),
                (None, None) => {
                    return Err(self.error(
                        field,
                        format!(
                            "environment variable {name} is not set (write ${{{name}:-default}} to allow that)"
                        ),
                    ));
                }
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file over [`MAX_CONFIG_BYTES`] is refused having read one byte past the bound,
    /// even one that never ends (`/dev/zero`); a file at the bound is read.
    #[test]
    fn a_config_file_past_its_bound_is_refused_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.json");
        let at_bound = " ".repeat(usize::try_from(MAX_CONFIG_BYTES).unwrap() - 2);
        std::fs::write(&big, format!("{{}}{at_bound}")).unwrap();
        assert_eq!(
            read_config_text(&big).unwrap().len() as u64,
            MAX_CONFIG_BYTES
        );
        std::fs::write(&big, format!("{{}}{at_bound} ")).unwrap();
        let refused = McpConfig::load(&big).unwrap_err();
        let ConfigError::Read { source, .. } = &refused else {
            panic!("{refused:?}");
        };
        assert_eq!(source.kind(), std::io::ErrorKind::FileTooLarge, "{refused}");
        let endless = read_config_text(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(endless.kind(), std::io::ErrorKind::FileTooLarge);
        // Not text, past the bound: refused for its size; within it, as not UTF-8.
        std::fs::write(
            &big,
            vec![0xff; usize::try_from(MAX_CONFIG_BYTES).unwrap() + 1],
        )
        .unwrap();
        let binary = read_config_text(&big).unwrap_err();
        assert_eq!(binary.kind(), std::io::ErrorKind::FileTooLarge);
        std::fs::write(&big, [0xff, b'{', b'}']).unwrap();
        let binary = read_config_text(&big).unwrap_err();
        assert_eq!(binary.kind(), std::io::ErrorKind::InvalidData);
    }

    #[test]
    fn output_limits_are_read_per_server_and_tool_and_refused_by_field() {
        let config = McpConfig::parse(
            r#"{"mcpServers": {
                "a": {"command": "x", "output": {"perResultTokens": 500, "headChars": 100,
                      "tools": {"search": {"perResultTokens": 4000, "tailChars": 0}}}},
                "b": {"command": "x"}
            }}"#,
            |_| None,
        )
        .unwrap();
        let limits = config.output_limits().unwrap();
        let tool = |server: &str, tool: &str| {
            ToolRef::new(ServerId::new(server).unwrap(), ToolName::new(tool).unwrap())
        };
        assert_eq!(
            limits.for_tool(&tool("a", "search")),
            OutputLimit {
                per_result_tokens: Some(4000),
                head_chars: Some(100),
                tail_chars: Some(0),
            }
        );
        assert_eq!(
            limits.for_tool(&tool("a", "other")).per_result_tokens,
            Some(500)
        );
        assert_eq!(
            limits.for_tool(&tool("b", "search")),
            OutputLimit::default()
        );
        // `null` is no entry, as for Psych's other keys.
        let none = McpConfig::parse(
            r#"{"mcpServers": {"a": {"command": "x", "output": null}}}"#,
            |_| None,
        )
        .unwrap();
        assert!(none.output_limits().unwrap().is_empty());
        // The entry stays in `extra` for clients that share the file.
        assert!(
            config.servers[&ServerId::new("a").unwrap()]
                .extra
                .contains_key(OUTPUT)
        );

        for (bad, field) in [
            (r#""big""#, "output"),
            (r#"{"perResultTokens": 0}"#, "output.perResultTokens"),
            (r#"{"perResultToken": 5}"#, "output.perResultToken"),
            (r#"{"headChars": -1}"#, "output.headChars"),
            (r#"{"tailChars": "10"}"#, "output.tailChars"),
            (r#"{"tools": []}"#, "output.tools"),
            (r#"{"tools": {"s": 5}}"#, "output.tools.s"),
            (
                r#"{"tools": {"s": {"perResultTokens": 0}}}"#,
                "output.tools.s.perResultTokens",
            ),
            (r#"{"tools": {"no spaces": {}}}"#, "output.tools.no spaces"),
            (
                r#"{"tools": {"s": {"headChars": 1.5}}}"#,
                "output.tools.s.headChars",
            ),
        ] {
            let text = format!(r#"{{"mcpServers": {{"a": {{"command": "x", "output": {bad}}}}}}}"#);
            match McpConfig::parse(&text, |_| None) {
                Err(ConfigError::Field {
                    server, field: got, ..
                }) => {
                    assert_eq!((server.as_str(), got.as_str()), ("a", field), "{bad}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn allow_tools_narrows_the_grant_and_its_absence_grants_the_server() {
        let config = McpConfig::parse(
            r#"{"mcpServers": {
                "a": {"command": "x", "allowTools": ["echo", "large"]},
                "b": {"command": "y"}
            }}"#,
            |_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let grant = config.grant().unwrap_or_else(|e| panic!("{e}"));
        let permits = |s: &str, t: &str| {
            let pair = ToolRef::parse(s, t).unwrap_or_else(|e| panic!("{e}"));
            grant.permits(&pair.server, &pair.tool)
        };
        assert!(permits("a", "echo"));
        assert!(permits("a", "large"));
        assert!(!permits("a", "crash"));
        assert!(permits("b", "anything"));
    }

    #[test]
    fn the_start_policy_defaults_to_lazy_and_reads_its_keys() {
        use std::time::Duration;
        let config = McpConfig::parse(
            r#"{"mcpServers": {
                "a": {"command": "x"},
                "b": {"command": "y", "lazy": false, "listingTtlSecs": 60, "idleSecs": 1}
            }}"#,
            |_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let policy = |name: &str| {
            let server = ServerId::new(name).unwrap_or_else(|e| panic!("{e}"));
            config.servers[&server]
                .start_policy()
                .unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(policy("a"), StartPolicy::default());
        assert!(policy("a").lazy);
        assert_eq!(policy("a").listing_ttl, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(
            policy("b"),
            StartPolicy {
                lazy: false,
                listing_ttl: Duration::from_secs(60),
                idle: Duration::from_secs(1),
            }
        );
        // Psych's keys stay in the entry (other clients ignore them).
        let b = ServerId::new("b").unwrap_or_else(|e| panic!("{e}"));
        assert!(config.servers[&b].extra.contains_key(LAZY));
    }

    /// A key given twice in any object (a server, a server's `allowTools`) is refused: a
    /// map would keep one of the two entries and drop the other without a word (before, a
    /// second `github` entry without `allowTools` silently widened the first's grant).
    #[test]
    fn a_key_given_twice_is_refused_naming_where() {
        let parse = |text: &str| McpConfig::parse(text, |_| None);
        for (text, path) in [
            (
                r#"{"mcpServers": {"github": {"command": "gh", "allowTools": ["get_issue"]},
                                   "github": {"command": "gh"}}}"#,
                "mcpServers.github",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "env": {"A": "1", "A": "2"}}}}"#,
                "mcpServers.fs.env.A",
            ),
            (
                r#"{"mcpServers": {}, "mcpServers": {"fs": {"command": "x"}}}"#,
                "mcpServers",
            ),
            (
                r#"{"mcpServers": {"fs": {"command": "x", "args": [{"k": 1, "k": 2}]}}}"#,
                "mcpServers.fs.args[0].k",
            ),
        ] {
            match parse(text) {
                Err(ConfigError::RepeatedKey { path: found }) => assert_eq!(found, path),
                other => panic!("{text}: {other:?}"),
            }
        }
        let error = parse(r#"{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "MCP config: mcpServers.a is given twice; keep one of the two"
        );
        // The same key in two objects is two keys; a key repeated outside `mcpServers` is
        // the client's own file's.
        parse(r#"{"mcpServers": {"a": {"command": "x"}, "b": {"command": "x"}}}"#).unwrap();
        parse(r#"{"theme": "dark", "theme": "light", "mcpServers": {}}"#).unwrap();
    }

    #[test]
    fn a_malformed_start_policy_fails_loading_with_the_server_and_field_named() {
        for (bad, field) in [
            (r#""lazy": "yes""#, LAZY),
            (r#""listingTtlSecs": 0"#, LISTING_TTL_SECS),
            (r#""listingTtlSecs": -5"#, LISTING_TTL_SECS),
            (r#""idleSecs": 1.5"#, IDLE_SECS),
            (r#""idleSecs": 0"#, IDLE_SECS),
            (r#""listingTtlSecs": 31536001"#, LISTING_TTL_SECS),
            (r#""idleSecs": "300""#, IDLE_SECS),
        ] {
            let text = format!(r#"{{"mcpServers": {{"s": {{"command": "x", {bad}}}}}}}"#);
            match McpConfig::parse(&text, |_| None) {
                Err(ConfigError::Field {
                    server, field: f, ..
                }) => {
                    assert_eq!((server.as_str(), f.as_str()), ("s", field), "{bad}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    /// A grant fails closed: a key meant to narrow a server that Psych would not read is
    /// refused, not kept unread with the server granted whole.
    #[test]
    fn a_narrowing_key_psych_does_not_read_is_refused() {
        for key in [
            "allowedTools",
            "allowed_tools",
            "AllowTools",
            "allow-tools",
            "allowtools",
            "includeTools",
            "excludeTools",
            "disabledTools",
            "enabledTools",
            "Lazy",
            "idle_secs",
        ] {
            let text =
                format!(r#"{{"mcpServers": {{"a": {{"command": "x", "{key}": ["get_issue"]}}}}}}"#);
            match McpConfig::parse(&text, |_| None) {
                Err(ConfigError::UnreadKey {
                    server,
                    key: found,
                    advice,
                }) => {
                    assert_eq!((server.as_str(), found.as_str()), ("a", key));
                    assert!(advice.contains('"'), "{advice}");
                }
                other => panic!("{key}: {other:?}"),
            }
        }
        // Other clients' keys that narrow nothing are kept, as ever.
        let text = r#"{"mcpServers": {"a": {"command": "x", "alwaysAllow": ["t"],
                       "autoApprove": [], "timeout": 60, "trust": true,
                       "disabledTools": [], "excludeTools": []}}}"#;
        let config = McpConfig::parse(text, |_| None).unwrap();
        assert_eq!(config.servers[&ServerId::new("a").unwrap()].extra.len(), 6);
    }

    /// A server another client turned off is left out, as that client leaves it out.
    #[test]
    fn an_entry_disabled_is_left_out_and_named() {
        let text = r#"{"mcpServers": {
            "on": {"command": "x", "disabled": false},
            "off": {"command": "x", "disabled": true},
            "off.too": {"not": "even an entry Psych could read", "disabled": true}}}"#;
        let config = McpConfig::parse(text, |_| None).unwrap();
        let names: Vec<&str> = config.servers.keys().map(ServerId::as_str).collect();
        assert_eq!(names, ["on"]);
        assert_eq!(config.disabled, ["off", "off.too"]);
        let bad = r#"{"mcpServers": {"a": {"command": "x", "disabled": "yes"}}}"#;
        match McpConfig::parse(bad, |_| None) {
            Err(ConfigError::Field { server, field, .. }) => {
                assert_eq!((server.as_str(), field.as_str()), ("a", DISABLED));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_malformed_allow_list_fails_loading_with_the_server_and_field_named() {
        for (bad, field) in [
            (r#""echo""#, "allowTools"),
            (r#"[1]"#, "allowTools[0]"),
            (r#"["ok", "no spaces allowed"]"#, "allowTools[1]"),
        ] {
            let text =
                format!(r#"{{"mcpServers": {{"a": {{"command": "x", "allowTools": {bad}}}}}}}"#);
            match McpConfig::parse(&text, |_| None) {
                Err(ConfigError::Field {
                    server, field: at, ..
                }) => assert_eq!((server.as_str(), at.as_str()), ("a", field), "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "HOME" => Some("/home/me".into()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<McpConfig, ConfigError> {
        McpConfig::parse(text, env)
    }

    fn error(text: &str) -> String {
        match parse(text) {
            Ok(config) => panic!("accepted: {config:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn server(s: &str) -> ServerId {
        ServerId::new(s).unwrap()
    }

    #[test]
    fn reads_the_common_clients_format_and_psychs_keys() {
        let config = parse(
            r#"{
              "mcpServers": {
                "fs": {"command": "npx", "args": ["-y", "server-filesystem", "${HOME}/src"],
                       "env": {"LOG": "debug"}, "cwd": "/tmp", "disabled": false},
                "github": {"type": "http", "url": "https://api.example.com/mcp",
                           "headers": {"Authorization": "Bearer ${TOKEN}"},
                           "preload": false, "eagerTools": ["get_me"],
                           "description": "GitHub issues and pull requests"},
                "memory": {"type": "stdio", "command": "memory-server", "preload": true}
              },
              "globalShortcut": "Ctrl+Space"
            }"#,
        )
        .unwrap();
        assert_eq!(
            config
                .servers
                .keys()
                .map(ServerId::as_str)
                .collect::<Vec<_>>(),
            ["fs", "github", "memory"]
        );
        assert_eq!(config.extra["globalShortcut"], "Ctrl+Space");

        let fs = &config.servers[&server("fs")];
        assert_eq!(
            fs.transport,
            Transport::Stdio {
                command: "npx".into(),
                args: vec![
                    "-y".into(),
                    "server-filesystem".into(),
                    "/home/me/src".into()
                ],
                env: BTreeMap::from([("LOG".into(), "debug".into())]),
                cwd: Some(PathBuf::from("/tmp")),
            }
        );
        assert_eq!(fs.connection.preload, Preload::Auto);
        assert_eq!(fs.extra["disabled"], false, "unknown keys are kept");

        let github = &config.servers[&server("github")];
        assert_eq!(
            github.transport,
            Transport::Http {
                url: "https://api.example.com/mcp".into(),
                headers: BTreeMap::from([("Authorization".into(), "Bearer s3cret".into())]),
            }
        );
        assert_eq!(github.connection.preload, Preload::Deferred);
        assert!(
            github
                .connection
                .eager_tools
                .contains(&ToolName::new("get_me").unwrap())
        );
        assert_eq!(
            github.connection.description.as_deref(),
            Some("GitHub issues and pull requests")
        );
        assert!(github.extra.is_empty(), "Psych's keys are not extra");
        assert_eq!(
            config.servers[&server("memory")].connection.preload,
            Preload::Eager
        );
    }

    #[test]
    fn type_is_inferred_or_accepted_as_clients_write_it() {
        for kind in ["http", "streamable-http", "streamableHttp"] {
            let text = format!(
                r#"{{"mcpServers":{{"a":{{"type":"{kind}","url":"http://127.0.0.1:1/mcp"}}}}}}"#
            );
            assert!(matches!(
                parse(&text).unwrap().servers[&server("a")].transport,
                Transport::Http { .. }
            ));
        }
        let remote = parse(r#"{"mcpServers":{"a":{"url":"http://127.0.0.1:1/mcp"}}}"#).unwrap();
        assert!(matches!(
            remote.servers[&server("a")].transport,
            Transport::Http { .. }
        ));
    }

    #[test]
    fn expansion_has_defaults_and_keeps_a_bare_dollar() {
        let config = parse(
            r#"{"mcpServers":{"a":{"command":"run","args":["${MISSING:-fallback}","$HOME","cost $5","${TOKEN}${TOKEN}"]}}}"#,
        )
        .unwrap();
        let Transport::Stdio { args, .. } = &config.servers[&server("a")].transport else {
            panic!("not stdio");
        };
        assert_eq!(args, &["fallback", "$HOME", "cost $5", "s3crets3cret"]);
    }

    #[test]
    fn malformed_files_name_the_server_and_the_field() {
        let cases = [
            ("[]", "the document is not an object"),
            (r#"{"servers":{}}"#, "there is no \"mcpServers\" key"),
            (r#"{"mcpServers":[]}"#, "\"mcpServers\" is not an object"),
            (
                r#"{"mcpServers":{"a b":{"command":"x"}}}"#,
                "server name \"a b\"",
            ),
            (
                r#"{"mcpServers":{"a":"npx"}}"#,
                "server \"a\", field \"\": a server entry must be a JSON object",
            ),
            (
                r#"{"mcpServers":{"a":{}}}"#,
                "server \"a\", field \"command\": missing",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","url":"http://h"}}}"#,
                "field \"type\": both",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","args":["ok",3]}}}"#,
                "field \"args[1]\": expected a string",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","args":"-y"}}}"#,
                "field \"args\": expected an array",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","env":{"K":1}}}}"#,
                "field \"env.K\": expected a string",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","env":{"K":"${NOPE}"}}}}"#,
                "field \"env.K\": environment variable NOPE is not set",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","env":{"K":"${1X}"}}}}"#,
                "does not name an environment variable",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","env":{"K":"${OPEN"}}}}"#,
                "without a closing",
            ),
            (
                r#"{"mcpServers":{"a":{"command":""}}}"#,
                "field \"command\": is empty",
            ),
            (
                r#"{"mcpServers":{"a":{"type":"sse","url":"http://h"}}}"#,
                "legacy SSE",
            ),
            (
                r#"{"mcpServers":{"a":{"type":"ws","url":"http://h"}}}"#,
                "unknown transport \"ws\"",
            ),
            (
                r#"{"mcpServers":{"a":{"type":"http","url":"ftp://h"}}}"#,
                "is not an http(s) URL",
            ),
            (
                r#"{"mcpServers":{"a":{"type":"http","url":"http://h","args":[]}}}"#,
                "field \"args\": not used by a remote",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","headers":{}}}}"#,
                "field \"headers\": not used by a stdio",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","preload":"yes"}}}"#,
                "field \"preload\": expected true",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","eagerTools":["ok","bad name"]}}}"#,
                "field \"eagerTools[1]\"",
            ),
            (
                r#"{"mcpServers":{"a":{"command":"x","description":7}}}"#,
                "field \"description\": expected a string",
            ),
        ];
        for (text, expected) in cases {
            let message = error(text);
            assert!(
                message.contains(expected),
                "{text}\n  gave {message:?}\n  expected it to contain {expected:?}"
            );
        }
        assert!(matches!(parse("{"), Err(ConfigError::Json(_))));
    }

    #[test]
    fn a_missing_file_is_a_read_error_naming_it() {
        let err = McpConfig::load(Path::new("/nonexistent/psych/mcp.json")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }));
        assert!(err.to_string().contains("/nonexistent/psych/mcp.json"));
    }
}
