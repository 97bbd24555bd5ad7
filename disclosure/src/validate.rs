//! Argument validation against a tool's input schema, compiled once per
//! `(server, catalogue version)` and kept by the caller across turns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use psych_types::{CatalogVersion, ServerId, ToolDefinition, ToolName};
use serde::Serialize;
use serde_json::Value;

use crate::text::{TRUNCATION_MARKER, cap_chars};

/// The most validation errors one refusal reports; the rest are counted.
const MAX_REPORTED_ERRORS: usize = 5;

/// The most characters of one validation message.
const MESSAGE_CHARS: usize = 200;

// One cache is shared by callers on several threads (a gateway's sessions): a schema
// compiler that stopped being `Sync` fails here, not in a crate that shares it.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Validators>();
};

/// One way the arguments fail the schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgumentError {
    /// Where, as a JSON pointer into the arguments (`""` is the arguments object itself).
    pub path: String,
    /// What is wrong there. Values are not repeated, so the message stays short.
    pub message: String,
}

/// What validation did for a call that is forwarded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "validation", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Validation {
    /// The arguments were checked against the compiled input schema and match it.
    Checked,
    /// The input schema did not compile (for example a `$ref` to another document, which is
    /// never fetched), so only "the arguments are a JSON object" was checked; the server
    /// remains usable and judges the arguments itself.
    Unchecked {
        /// Why the schema did not compile.
        reason: String,
    },
}

enum Compiled {
    Ready(Box<jsonschema::Validator>),
    Failed(String),
}

struct ServerValidators {
    version: CatalogVersion,
    tools: HashMap<ToolName, Arc<Compiled>>,
}

/// Compiled input schemas, per server at one catalogue version.
///
/// Keep one across turns (the runtime owns it): a tool's schema is compiled the first time
/// one of its calls is guarded and reused until its server's catalogue version changes, at
/// which point that server's entries are dropped. A call guarded against an older version
/// than the one kept (a Surface resolved before the change) is checked against its own
/// version's schema, compiled for it and not kept.
///
/// Shared by reference between callers guarding at once: its lock is held only to look a
/// compiled schema up or store one, never while a schema compiles, arguments are checked
/// or schemas are freed, so one caller's slow guard (a large search, a large argument)
/// does not hold another's. Two first calls of one tool at once may both compile its
/// schema; the first stored is kept.
///
/// No network or file is ever read: the `jsonschema` crate is built without its resolvers,
/// so a schema whose `$ref` points outside itself fails to compile and its calls go
/// through [`Validation::Unchecked`]. So does a schema with more than 64 regular
/// expressions, or one whose compiled pattern would take over 256 KiB: a tool's compiled
/// patterns hold at most 16 MiB (each pattern's lazy DFA cache at most 256 KiB more per
/// thread matching it), whatever its server sends.
#[derive(Default)]
pub struct Validators {
    servers: Mutex<HashMap<ServerId, ServerValidators>>,
}

impl std::fmt::Debug for Validators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validators")
            .field("schemas", &self.len())
            .finish()
    }
}

impl Validators {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many schemas are compiled (or known not to compile).
    pub fn len(&self) -> usize {
        self.servers().values().map(|s| s.tools.len()).sum()
    }

    /// Whether nothing is compiled yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops what is compiled for `server` (a server removed from the Run): without it, a
    /// removed server's schemas stay until a newer catalogue version of the same name
    /// replaces them. A call to it guarded later compiles its schema again. The schemas are
    /// freed after the lock.
    pub fn forget(&self, server: &ServerId) {
        let forgotten = self.servers().remove(server);
        drop(forgotten);
    }

    /// The cache, locked (a panic under the lock left it whole: nothing there panics).
    fn servers(&self) -> std::sync::MutexGuard<'_, HashMap<ServerId, ServerValidators>> {
        self.servers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `tool`'s compiled schema at `(server, version)`: the one stored, or compiled now
    /// (without the lock) and stored, unless another caller stored one meanwhile.
    fn compiled(
        &self,
        server: &ServerId,
        version: CatalogVersion,
        tool: &ToolDefinition,
    ) -> Arc<Compiled> {
        let stored = self
            .servers()
            .get(server)
            .filter(|entry| entry.version == version)
            .and_then(|entry| entry.tools.get(&tool.name).cloned());
        if let Some(compiled) = stored {
            return compiled;
        }
        let compiled = Arc::new(compile(tool));
        // `compiled` is freed here, after the lock, if another caller's was stored first.
        self.store(server, version, &tool.name, &compiled)
            .unwrap_or(compiled)
    }

    /// Stores `compiled` as `tool`'s schema at `(server, version)` unless one is stored
    /// there already: the one stored before, or `None` when `compiled` is stored (or not
    /// kept, a newer version's schemas being cached). The older version's schemas it
    /// replaces are freed after the lock.
    fn store(
        &self,
        server: &ServerId,
        version: CatalogVersion,
        tool: &ToolName,
        compiled: &Arc<Compiled>,
    ) -> Option<Arc<Compiled>> {
        let mut servers = self.servers();
        let entry = servers
            .entry(server.clone())
            .or_insert_with(|| ServerValidators {
                version,
                tools: HashMap::new(),
            });
        // A call guarded against an older catalogue than the one cached (a session's
        // Surface resolved before the change) is checked, not cached: it would drop the
        // newer schemas the other sessions use.
        if entry.version > version {
            return None;
        }
        let mut replaced = HashMap::new();
        if entry.version < version {
            entry.version = version;
            replaced = std::mem::take(&mut entry.tools);
        }
        let stored = match entry.tools.get(tool) {
            Some(stored) => Some(Arc::clone(stored)),
            None => {
                entry.tools.insert(tool.clone(), Arc::clone(compiled));
                None
            }
        };
        drop(servers);
        drop(replaced);
        stored
    }

    /// Checks `arguments` against `tool`'s input schema, compiling it if this
    /// `(server, version, tool)` has not been seen.
    pub(crate) fn check(
        &self,
        server: &ServerId,
        version: CatalogVersion,
        tool: &ToolDefinition,
        arguments: &Value,
    ) -> Result<Validation, Vec<ArgumentError>> {
        if !arguments.is_object() {
            return Err(vec![ArgumentError {
                path: String::new(),
                message: format!(
                    "the arguments must be a JSON object, not {}",
                    psych_types::json_kind(arguments)
                ),
            }]);
        }
        let compiled = self.compiled(server, version, tool);
        match &*compiled {
            Compiled::Failed(reason) => Ok(Validation::Unchecked {
                reason: reason.clone(),
            }),
            Compiled::Ready(validator) if validator.is_valid(arguments) => Ok(Validation::Checked),
            Compiled::Ready(validator) => {
                let mut errors = Vec::new();
                let mut more = 0usize;
                for error in validator.iter_errors(arguments) {
                    if errors.len() < MAX_REPORTED_ERRORS {
                        errors.push(ArgumentError {
                            path: error.instance_path().to_string(),
                            message: cap_chars(
                                &error.masked().to_string(),
                                MESSAGE_CHARS,
                                TRUNCATION_MARKER,
                            ),
                        });
                    } else {
                        more += 1;
                    }
                }
                if errors.is_empty() {
                    return Ok(Validation::Checked);
                }
                if more > 0 {
                    errors.push(ArgumentError {
                        path: String::new(),
                        message: format!("and {more} more errors"),
                    });
                }
                Err(errors)
            }
        }
    }
}

/// The most regular expressions (`pattern`, `patternProperties`) a schema is compiled with;
/// one with more is not compiled ([`Validation::Unchecked`]).
const MAX_PATTERNS: usize = 64;

/// The most memory one compiled pattern may take, and its lazy DFA's cache (per thread
/// matching it): a short pattern such as `\p{L}{50}` (10 bytes) takes some 3.6 MiB
/// compiled under the regex engine's own limits (10 MiB and 2 MiB; measured here). With
/// [`MAX_PATTERNS`], a schema's patterns hold at most 16 MiB compiled, whatever its server
/// sends. A pattern over it fails the schema's compilation ([`Validation::Unchecked`]).
const PATTERN_BYTES: usize = 256 << 10;

/// How many regular expressions `schema` holds: `pattern` strings and `patternProperties`
/// keys, wherever they are.
fn patterns(schema: &Value) -> usize {
    match schema {
        Value::Object(object) => object
            .iter()
            .map(|(key, value)| match (key.as_str(), value) {
                ("pattern", Value::String(_)) => 1,
                ("patternProperties", Value::Object(keys)) => {
                    keys.len() + keys.values().map(patterns).sum::<usize>()
                }
                _ => patterns(value),
            })
            .sum(),
        Value::Array(items) => items.iter().map(patterns).sum(),
        _ => 0,
    }
}

fn compile(tool: &ToolDefinition) -> Compiled {
    let schema = Value::Object(tool.input_schema.clone());
    let count = patterns(&schema);
    if count > MAX_PATTERNS {
        return Compiled::Failed(format!(
            "the schema holds {count} regular expressions, over the {MAX_PATTERNS} psych compiles"
        ));
    }
    let limits = jsonschema::PatternOptions::fancy_regex()
        .size_limit(PATTERN_BYTES)
        .dfa_size_limit(PATTERN_BYTES);
    match jsonschema::options()
        .with_pattern_options(limits)
        .build(&schema)
    {
        Ok(validator) => Compiled::Ready(Box::new(validator)),
        Err(error) => Compiled::Failed(cap_chars(
            &error.to_string(),
            MESSAGE_CHARS,
            TRUNCATION_MARKER,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn named(name: &str, schema: Value) -> ToolDefinition {
        let Value::Object(schema) = schema else {
            panic!("object")
        };
        ToolDefinition::new(ToolName::new(name).unwrap(), "d", schema)
    }

    fn tool(schema: Value) -> ToolDefinition {
        named("t", schema)
    }

    #[test]
    fn compiles_once_per_version() {
        let server = ServerId::new("s").unwrap();
        let t = tool(json!({"type": "object", "properties": {"n": {"type": "integer"}}}));
        let validators = Validators::new();
        assert_eq!(
            validators.check(&server, CatalogVersion(1), &t, &json!({"n": 1})),
            Ok(Validation::Checked)
        );
        let stored = || Arc::clone(&validators.servers()[&server].tools[&t.name]);
        let first = stored();
        assert!(matches!(*first, Compiled::Ready(_)), "compiles");
        let errors = validators
            .check(&server, CatalogVersion(1), &t, &json!({"n": "x"}))
            .unwrap_err();
        assert_eq!(errors[0].path, "/n");
        assert!(
            Arc::ptr_eq(&first, &stored()),
            "same version: the compiled schema is reused"
        );
        assert_eq!(validators.len(), 1);
        // A new version drops the old entries and compiles again.
        let t2 = tool(json!({"type": "object", "properties": {"n": {"type": "string"}}}));
        assert_eq!(
            validators.check(&server, CatalogVersion(2), &t2, &json!({"n": "x"})),
            Ok(Validation::Checked)
        );
        assert_eq!(validators.len(), 1);
        let newer = stored();
        // A call against the older version still gets its own schema's verdict, and the
        // newer schema stays cached.
        let errors = validators
            .check(&server, CatalogVersion(1), &t, &json!({"n": "x"}))
            .unwrap_err();
        assert_eq!(errors[0].path, "/n");
        assert!(Arc::ptr_eq(&newer, &stored()), "the newer schema is kept");
    }

    #[test]
    fn a_forgotten_server_leaves_nothing_and_others_keep_theirs() {
        let (a, b) = (ServerId::new("a").unwrap(), ServerId::new("b").unwrap());
        let t = tool(json!({"type": "object", "properties": {"n": {"type": "integer"}}}));
        let validators = Validators::new();
        for server in [&a, &b] {
            assert_eq!(
                validators.check(server, CatalogVersion(2), &t, &json!({"n": 1})),
                Ok(Validation::Checked)
            );
        }
        assert_eq!(validators.len(), 2);
        validators.forget(&a);
        assert_eq!(validators.len(), 1, "only b's schema is left");
        assert!(!validators.servers().contains_key(&a));
        validators.forget(&a);
        assert_eq!(validators.len(), 1, "forgetting twice is harmless");
        // A later call to the forgotten server is guarded as a first one, at any version.
        let errors = validators
            .check(&a, CatalogVersion(1), &t, &json!({"n": "x"}))
            .unwrap_err();
        assert_eq!(errors[0].path, "/n");
        assert_eq!(validators.len(), 2, "compiled and kept again");
    }

    #[test]
    fn non_objects_are_refused_and_bad_schemas_leave_the_tool_usable() {
        let server = ServerId::new("s").unwrap();
        let validators = Validators::new();
        let t = tool(json!({"type": "object"}));
        let errors = validators
            .check(&server, CatalogVersion(1), &t, &json!([1]))
            .unwrap_err();
        assert!(errors[0].message.contains("an array"), "{errors:?}");
        let remote = named("remote", json!({"$ref": "https://example.com/schema.json"}));
        let outcome = validators.check(&server, CatalogVersion(1), &remote, &json!({}));
        assert!(
            matches!(outcome, Ok(Validation::Unchecked { .. })),
            "{outcome:?}"
        );
        let broken = tool(json!({"type": "object", "properties": {"n": {"type": 7}}}));
        let server2 = ServerId::new("s2").unwrap();
        let outcome = validators.check(&server2, CatalogVersion(1), &broken, &json!({}));
        assert!(
            matches!(outcome, Ok(Validation::Unchecked { .. })),
            "{outcome:?}"
        );
    }

    /// A schema's regular expressions are bounded: a short pattern compiling to megabytes,
    /// or more patterns than psych compiles, leaves the tool usable and unchecked; a usual
    /// pattern is checked.
    #[test]
    fn patterns_are_compiled_within_bounds() {
        let server = ServerId::new("s").unwrap();
        let validators = Validators::new();
        let usual = named(
            "usual",
            json!({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2,10}-[0-9]+$"}}}),
        );
        assert_eq!(
            validators.check(
                &server,
                CatalogVersion(1),
                &usual,
                &json!({"id": "PROJ-12"})
            ),
            Ok(Validation::Checked)
        );
        assert!(
            validators
                .check(&server, CatalogVersion(1), &usual, &json!({"id": "x"}))
                .is_err()
        );
        // 10 bytes of pattern that take some 3.6 MiB compiled without the bound.
        let huge = named(
            "huge",
            json!({"type": "object", "properties": {"w": {"type": "string", "pattern": "\\p{L}{50}"}}}),
        );
        let outcome = validators.check(&server, CatalogVersion(1), &huge, &json!({"w": "x"}));
        assert!(
            matches!(outcome, Ok(Validation::Unchecked { .. })),
            "{outcome:?}"
        );
        let properties: serde_json::Map<String, Value> = (0..=MAX_PATTERNS)
            .map(|n| (format!("p{n}"), json!({"type": "string", "pattern": "^a$"})))
            .collect();
        let many = named("many", json!({"type": "object", "properties": properties}));
        match validators.check(&server, CatalogVersion(1), &many, &json!({})) {
            Ok(Validation::Unchecked { reason }) => {
                assert!(reason.contains("65 regular expressions"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            patterns(&json!({"patternProperties": {"^a": {"pattern": "b"}, "^c": {}}})),
            3
        );
    }

    /// Callers on several threads share one cache by reference: a schema is stored once
    /// and every caller's check reads it.
    #[test]
    fn callers_on_several_threads_share_one_cache() {
        let server = ServerId::new("s").unwrap();
        let t = tool(json!({"type": "object", "properties": {"n": {"type": "integer"}}}));
        let validators = Validators::new();
        std::thread::scope(|scope| {
            for n in 0..4 {
                let (validators, server, t) = (&validators, &server, &t);
                scope.spawn(move || {
                    for _ in 0..50 {
                        // Half the threads send valid arguments, half a string for `n`.
                        let verdict = if n % 2 == 0 {
                            validators.check(server, CatalogVersion(1), t, &json!({"n": n}))
                        } else {
                            validators.check(server, CatalogVersion(1), t, &json!({"n": "x"}))
                        };
                        match verdict {
                            Ok(checked) => {
                                assert!(n % 2 == 0);
                                assert_eq!(checked, Validation::Checked);
                            }
                            Err(errors) => {
                                assert!(n % 2 == 1);
                                assert_eq!(errors[0].path, "/n");
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(validators.len(), 1, "stored once");
    }
}
