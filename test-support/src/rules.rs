//! The rule checker: every rule a provider enforces on a request body that a Psych log could
//! break, checked on the JSON as the API would see it. Each rule has a test that feeds it a
//! body breaking that rule (`tests/rules.rs` of psych-prompt-assembly); the property tests
//! run it on every body they render, adversarial logs included.
//!
//! Image rules are checked on the bytes: the base64 decodes, the media type is the one the
//! magic bytes say, the header's dimensions and the sizes fit the limits. This module has
//! its own header reader, written apart from the renderer's.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "shared by several test crates; each uses a different part"
)]

pub mod images;

use serde_json::Value;

/// Anthropic's largest image, in base64 bytes.
pub const ANTHROPIC_MAX_IMAGE_BASE64: usize = 5 * 1024 * 1024;
/// The largest image side, in pixels.
pub const MAX_SIDE: u64 = 8000;
/// Images per request.
pub const MAX_IMAGES: usize = 100;
/// Above this many images, each at most [`MANY_IMAGES_MAX_SIDE`].
pub const MANY_IMAGES: usize = 20;
/// The side cap when a request holds more than [`MANY_IMAGES`] images.
pub const MANY_IMAGES_MAX_SIDE: u64 = 2000;
/// The request size limit of Anthropic's standard endpoints.
pub const MAX_REQUEST_BYTES: usize = 32 * 1024 * 1024;
/// OpenAI's tool cap.
pub const OPENAI_MAX_TOOLS: usize = 128;
/// OpenAI's call id cap, in characters.
pub const OPENAI_MAX_CALL_ID: usize = 40;

fn name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whitespace as a provider may count it (Unicode, the information separators, BOM).
fn is_space(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\u{1C}'..='\u{1F}' | '\u{FEFF}')
}

fn blank(text: &str) -> bool {
    text.chars().all(is_space)
}

/// The media type and dimensions the bytes say, read independently of the renderer.
pub fn sniff(data: &[u8]) -> Option<(&'static str, u64, u64)> {
    let be = |at: usize, n: usize| -> Option<u64> {
        Some(
            data.get(at..at + n)?
                .iter()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b)),
        )
    };
    let le = |at: usize, n: usize| -> Option<u64> {
        Some(
            data.get(at..at + n)?
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b)),
        )
    };
    if data.starts_with(b"\x89PNG\r\n\x1a\n") && data.get(12..16) == Some(b"IHDR") {
        return Some(("image/png", be(16, 4)?, be(20, 4)?));
    }
    if data.starts_with(b"GIF8") {
        return Some(("image/gif", le(6, 2)?, le(8, 2)?));
    }
    if data.starts_with(b"RIFF") && data.get(8..12) == Some(b"WEBP") {
        return match data.get(12..16)? {
            b"VP8X" => Some(("image/webp", le(24, 3)? + 1, le(27, 3)? + 1)),
            b"VP8L" => {
                let bits = le(21, 4)?;
                Some((
                    "image/webp",
                    (bits & 0x3fff) + 1,
                    ((bits >> 14) & 0x3fff) + 1,
                ))
            }
            b"VP8 " => Some(("image/webp", le(26, 2)? & 0x3fff, le(28, 2)? & 0x3fff)),
            _ => None,
        };
    }
    if data.starts_with(b"\xff\xd8") {
        let mut at = 2;
        while at + 4 <= data.len() {
            if data[at] != 0xff {
                return None;
            }
            let marker = data[at + 1];
            if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
                return Some(("image/jpeg", be(at + 7, 2)?, be(at + 5, 2)?));
            }
            at += 2 + be(at + 2, 2)? as usize;
        }
    }
    None
}

/// The bytes of standard padded base64 `data`, decoded as MCP image data is (through the
/// serde form of `ContentBlock`, which keeps a block with bad base64 as an unknown block).
fn decode_base64(data: &str) -> Option<Vec<u8>> {
    let block: psych_types::ContentBlock = serde_json::from_value(
        serde_json::json!({"type": "image", "data": data, "mimeType": "image/png"}),
    )
    .ok()?;
    block.binary().map(|binary| binary.data.to_vec())
}

/// Checks one image (base64 `data` declared as `media_type`); returns its larger side.
fn check_image(media_type: &str, data: &str, providers_types: &[&str]) -> Result<u64, String> {
    if data.len() > ANTHROPIC_MAX_IMAGE_BASE64 {
        return Err(format!(
            "an image of {} bytes of base64 (over 5 MB)",
            data.len()
        ));
    }
    let bytes = decode_base64(data).ok_or("image data is not standard padded base64")?;
    let (sniffed, width, height) =
        sniff(&bytes).ok_or_else(|| format!("image bytes are no image ({media_type})"))?;
    if sniffed != media_type {
        return Err(format!(
            "image declared {media_type} but its bytes are {sniffed}"
        ));
    }
    if !providers_types.contains(&media_type) {
        return Err(format!("image type {media_type} not accepted"));
    }
    if width == 0 || height == 0 || width.max(height) > MAX_SIDE {
        return Err(format!("image of {width}x{height} px"));
    }
    Ok(width.max(height))
}

/// Checks the count rules over the larger sides of a request's images.
fn check_image_counts(sides: &[u64]) -> Result<(), String> {
    if sides.len() > MAX_IMAGES {
        return Err(format!("{} images in one request", sides.len()));
    }
    if sides.len() > MANY_IMAGES && sides.iter().any(|&s| s > MANY_IMAGES_MAX_SIDE) {
        return Err(format!(
            "{} images in one request and one over {MANY_IMAGES_MAX_SIDE} px",
            sides.len()
        ));
    }
    Ok(())
}

/// Whether a block list holds a text block without non-whitespace text, searching
/// `tool_result` content too.
fn has_blank_text(blocks: &[Value]) -> bool {
    blocks.iter().any(|b| {
        (b["type"] == "text" && b["text"].as_str().is_none_or(blank))
            || b["content"]
                .as_array()
                .is_some_and(|inner| inner.is_empty() || has_blank_text(inner))
    })
}

/// Checks a rendered Anthropic Messages body as the API would:
/// - valid JSON, under the 32 MB request limit;
/// - every tool name within `^[a-zA-Z0-9_-]{1,64}$`;
/// - the first message is a user message;
/// - every `tool_use` is answered by exactly one `tool_result` at the start of the next
///   (user) message, in order; no `tool_result` without its `tool_use`, none after other
///   blocks; `tool_use` only in assistant messages, with a valid name and an object `input`;
/// - `tool_use` or `tool_result` blocks only when the request declares tools;
/// - no message without content; no text block (system, message, or inside a
///   `tool_result`) that is empty or only whitespace; `tool_result` content only text and
///   image blocks;
/// - a final assistant message does not end in whitespace;
/// - every image: base64 of at most 5 MB, bytes of the declared type (PNG, JPEG, GIF,
///   WebP), at most 8000 px a side; at most 100 images, and at most 2000 px a side when more
///   than 20;
/// - at most four `cache_control` breakpoints, none on the transient message;
/// - deferral: tool names unique; a tool with `defer_loading: true` needs a search tool in
///   the request, never deferred itself (Anthropic's `tool_search_tool_*`, or a client tool
///   whose name contains `search`), so at least one tool is not deferred; a `tool_reference`
///   block (only inside a `tool_result`) names a tool present with `defer_loading: true`.
pub fn check_anthropic_body(body: &str, has_transient: bool) -> Result<(), String> {
    if body.len() > MAX_REQUEST_BYTES {
        return Err(format!("a request of {} bytes", body.len()));
    }
    let value: Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    if let Some(system) = value.get("system") {
        let blocks = system.as_array().ok_or("system is not blocks")?;
        if blocks.is_empty() || has_blank_text(blocks) {
            return Err("an empty system or a blank system text block".into());
        }
    }
    let tools = value["tools"].as_array().map_or(0, Vec::len);
    let mut names = std::collections::BTreeSet::new();
    let mut deferred = std::collections::BTreeSet::new();
    let mut search = false;
    for tool in value["tools"].as_array().into_iter().flatten() {
        let name = tool["name"].as_str().unwrap_or("");
        if !name_ok(name) {
            return Err(format!("bad tool name {}", tool["name"]));
        }
        if !names.insert(name.to_owned()) {
            return Err(format!("tool {name} declared twice"));
        }
        let server_search = tool["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("tool_search_tool_"));
        if tool["defer_loading"] == true {
            if server_search {
                return Err("the search tool is deferred".into());
            }
            deferred.insert(name.to_owned());
        } else if server_search || name.contains("search") {
            search = true;
        }
    }
    if !deferred.is_empty() && !search {
        return Err("deferred tools without a search tool".into());
    }
    let messages = value["messages"].as_array().ok_or("no messages")?;
    if messages.first().is_none_or(|m| m["role"] != "user") {
        return Err("the first message is not a user message".into());
    }
    let mut expected: Vec<String> = Vec::new();
    let mut image_sides = Vec::new();
    for message in messages {
        let content = message["content"]
            .as_array()
            .ok_or("content is not blocks")?;
        let results: Vec<String> = content
            .iter()
            .take_while(|b| b["type"] == "tool_result")
            .map(|b| b["tool_use_id"].as_str().unwrap_or("").to_owned())
            .collect();
        if results != expected {
            return Err(format!("expected results {expected:?}, found {results:?}"));
        }
        if content
            .iter()
            .skip(results.len())
            .any(|b| b["type"] == "tool_result")
        {
            return Err("a tool_result after other blocks".into());
        }
        if content.is_empty() {
            return Err("a message without content".into());
        }
        if has_blank_text(content) {
            return Err("a text block without non-whitespace text".into());
        }
        if tools == 0
            && content
                .iter()
                .any(|b| b["type"] == "tool_use" || b["type"] == "tool_result")
        {
            return Err("tool_use or tool_result blocks in a request without tools".into());
        }
        let mut images: Vec<&Value> = content.iter().filter(|b| b["type"] == "image").collect();
        for result in content.iter().filter(|b| b["type"] == "tool_result") {
            for inner in result["content"].as_array().into_iter().flatten() {
                match inner["type"].as_str() {
                    Some("text") => {}
                    Some("image") => images.push(inner),
                    Some("tool_reference") => {
                        let name = inner["tool_name"].as_str().unwrap_or("");
                        if !deferred.contains(name) {
                            return Err(format!(
                                "a tool_reference to {name:?}, not a deferred tool of the request"
                            ));
                        }
                    }
                    other => return Err(format!("a {other:?} block in a tool_result")),
                }
            }
        }
        for image in images {
            let source = &image["source"];
            if source["type"] != "base64" {
                return Err(format!("an image source of type {}", source["type"]));
            }
            image_sides.push(check_image(
                source["media_type"].as_str().unwrap_or(""),
                source["data"].as_str().unwrap_or(""),
                &["image/png", "image/jpeg", "image/gif", "image/webp"],
            )?);
        }
        expected = content
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| {
                let name = b["name"].as_str().unwrap_or("");
                if name_ok(name) && b["input"].is_object() {
                    Ok(b["id"].as_str().unwrap_or("").to_owned())
                } else {
                    Err(format!("bad tool_use {b}"))
                }
            })
            .collect::<Result<_, _>>()?;
        if !expected.is_empty() && message["role"] != "assistant" {
            return Err("tool_use outside an assistant message".into());
        }
    }
    check_image_counts(&image_sides)?;
    if !expected.is_empty() {
        return Err(format!("unanswered calls {expected:?}"));
    }
    if let Some(last) = messages.last()
        && last["role"] == "assistant"
        && let Some(text) = last["content"]
            .as_array()
            .and_then(|c| c.last())
            .and_then(|b| b["text"].as_str())
        && text.ends_with(is_space)
    {
        return Err("the final assistant content ends in whitespace".into());
    }
    if body.matches("\"cache_control\"").count() > 4 {
        return Err("more than four breakpoints".into());
    }
    if has_transient
        && messages
            .last()
            .is_some_and(|m| m.to_string().contains("cache_control"))
    {
        return Err("a breakpoint on the transient message".into());
    }
    Ok(())
}

/// Checks a rendered OpenAI Chat Completions body:
/// - valid JSON; at most 128 tools, each named within `^[a-zA-Z0-9_-]{1,64}$`;
/// - every assistant `tool_calls` entry is of type `function`, has a valid name, an id of
///   at most 40 characters, and `arguments` whose text parses as a JSON object; it is
///   followed by one `tool` message per id, in order, and no `tool` message comes otherwise;
/// - `tool` message content is a string (tool messages carry no image);
/// - every user message has content: a non-empty string, or a non-empty list of parts, each
///   a non-empty text part or an `image_url` part whose data URL holds an image of its
///   declared type (PNG, JPEG or WebP; not GIF, which OpenAI takes only when not animated)
///   within the size limits; the image count rules as for Anthropic.
pub fn check_openai_body(body: &str) -> Result<(), String> {
    let value: Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let tools = value["tools"].as_array().map_or(&[][..], Vec::as_slice);
    if tools.len() > OPENAI_MAX_TOOLS {
        return Err(format!(
            "{} tools (at most {OPENAI_MAX_TOOLS})",
            tools.len()
        ));
    }
    for tool in tools {
        if !name_ok(tool["function"]["name"].as_str().unwrap_or("")) {
            return Err(format!("bad tool name {}", tool["function"]["name"]));
        }
    }
    let messages = value["messages"].as_array().ok_or("no messages")?;
    let mut expected: std::collections::VecDeque<String> = Default::default();
    let mut image_sides = Vec::new();
    for message in messages {
        if message["role"] == "tool" {
            let id = message["tool_call_id"].as_str().unwrap_or("");
            if expected.pop_front().as_deref() != Some(id) {
                return Err(format!("unexpected tool message for {id}"));
            }
            if !message["content"].is_string() {
                return Err("tool content is not a string".into());
            }
            continue;
        }
        if !expected.is_empty() {
            return Err(format!("unanswered calls {expected:?}"));
        }
        if message["role"] == "user" {
            match &message["content"] {
                Value::String(text) if !text.is_empty() => {}
                Value::Array(parts) if !parts.is_empty() => {
                    for part in parts {
                        match part["type"].as_str() {
                            Some("text")
                                if part["text"].as_str().is_some_and(|t| !t.is_empty()) => {}
                            Some("image_url") => {
                                let url = part["image_url"]["url"].as_str().unwrap_or("");
                                let (media_type, data) = url
                                    .strip_prefix("data:")
                                    .and_then(|rest| rest.split_once(";base64,"))
                                    .ok_or_else(|| {
                                        format!("an image URL that is no data URL: {url:.40}")
                                    })?;
                                image_sides.push(check_image(
                                    media_type,
                                    data,
                                    &["image/png", "image/jpeg", "image/webp"],
                                )?);
                            }
                            _ => return Err(format!("a bad user content part {part:.80}")),
                        }
                    }
                }
                other => return Err(format!("a user message without content: {other:.80}")),
            }
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let arguments = call["function"]["arguments"]
                .as_str()
                .ok_or("arguments not a string")?;
            if !serde_json::from_str::<Value>(arguments).is_ok_and(|v| v.is_object()) {
                return Err(format!(
                    "arguments that are not a JSON object: {arguments:.60}"
                ));
            }
            let name = call["function"]["name"].as_str().unwrap_or("");
            if !name_ok(name) || call["type"] != "function" {
                return Err(format!("bad call {call:.80}"));
            }
            let id = call["id"].as_str().unwrap_or("");
            if id.is_empty() || id.chars().count() > OPENAI_MAX_CALL_ID {
                return Err(format!("a call id of {} characters", id.chars().count()));
            }
            expected.push_back(id.to_owned());
        }
    }
    check_image_counts(&image_sides)?;
    if expected.is_empty() {
        Ok(())
    } else {
        Err(format!("unanswered calls {expected:?}"))
    }
}

/// Checks a data-URL image part (`data:<type>;base64,<data>`) as OpenAI takes it.
fn check_data_url(url: &str) -> Result<u64, String> {
    let (media_type, data) = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(";base64,"))
        .ok_or_else(|| format!("an image URL that is no data URL: {url:.40}"))?;
    check_image(media_type, data, &["image/png", "image/jpeg", "image/webp"])
}

/// Checks a rendered OpenAI Responses API body:
/// - valid JSON; at most 128 tools; each `function` tool named within
///   `^[a-zA-Z0-9_-]{1,64}$`, with `parameters` and `strict`; names unique; a tool with
///   `defer_loading: true` is a function tool, and needs a `tool_search` tool in the request
///   (which is never deferred);
/// - `instructions`, when present, is a string;
/// - every input item is a `message` (role `user` or `assistant`, content a non-empty
///   string or a non-empty list of non-empty `input_text` parts and valid `input_image`
///   parts), a `function_call` (valid name, a `call_id` of at most 40 characters, `arguments`
///   whose text parses as a JSON object), a `function_call_output`, a `tool_search_call` or a
///   `tool_search_output`;
/// - pairing: the outputs answering a run of calls come right after that run, one per
///   `call_id`, in call order; no output answers a call not made; no call is left unanswered;
///   a `tool_search_output` answers a `tool_search_call` with its `call_id` the same way;
/// - a `function_call_output`'s `output` is a string or a non-empty list of `input_text` and
///   `input_image` parts; images as for Chat Completions (PNG, JPEG, WebP data URLs within
///   the limits; the count rules);
/// - a `tool_search_output`'s `tools` are function tools named in the request with
///   `defer_loading: true` (a reference to a tool that is not deferred, or absent, is refused).
pub fn check_responses_body(body: &str) -> Result<(), String> {
    let value: Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let tools = value["tools"].as_array().map_or(&[][..], Vec::as_slice);
    if tools.len() > OPENAI_MAX_TOOLS {
        return Err(format!(
            "{} tools (at most {OPENAI_MAX_TOOLS})",
            tools.len()
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    let mut deferred = std::collections::BTreeSet::new();
    let mut search = false;
    for tool in tools {
        match tool["type"].as_str() {
            Some("function") => {
                let name = tool["name"].as_str().unwrap_or("");
                if !name_ok(name) {
                    return Err(format!("bad tool name {}", tool["name"]));
                }
                if !names.insert(name.to_owned()) {
                    return Err(format!("tool {name} declared twice"));
                }
                if tool.get("parameters").is_none() || !tool["strict"].is_boolean() {
                    return Err(format!("tool {name} without parameters or strict"));
                }
                if tool["defer_loading"] == true {
                    deferred.insert(name.to_owned());
                }
            }
            Some("tool_search") => {
                if tool.get("defer_loading").is_some() {
                    return Err("the tool_search tool is deferred".into());
                }
                search = true;
            }
            _ => return Err(format!("a tool of unknown type {tool:.80}")),
        }
    }
    if !deferred.is_empty() && !search {
        return Err("deferred tools without a tool_search tool".into());
    }
    if value.get("instructions").is_some_and(|i| !i.is_string()) {
        return Err("instructions are not a string".into());
    }
    let input = value["input"].as_array().ok_or("no input")?;
    let mut expected: std::collections::VecDeque<(String, bool)> = Default::default();
    let mut answering = false;
    let mut image_sides = Vec::new();
    for item in input {
        let kind = item["type"].as_str().unwrap_or("");
        match kind {
            "function_call_output" | "tool_search_output" => {
                let id = item["call_id"].as_str().unwrap_or("");
                let search_output = kind == "tool_search_output";
                if expected.pop_front() != Some((id.to_owned(), search_output)) {
                    return Err(format!("unexpected {kind} for {id}"));
                }
                answering = true;
            }
            "function_call" | "tool_search_call" if !answering => {}
            _ => {
                if !expected.is_empty() {
                    return Err(format!("unanswered calls {expected:?}"));
                }
                answering = false;
            }
        }
        match kind {
            "message" => match item["role"].as_str() {
                Some("user" | "assistant") => match &item["content"] {
                    Value::String(text) if !text.is_empty() => {}
                    Value::Array(parts) if !parts.is_empty() => {
                        for part in parts {
                            match part["type"].as_str() {
                                Some("input_text")
                                    if part["text"].as_str().is_some_and(|t| !t.is_empty()) => {}
                                Some("input_image") => image_sides.push(check_data_url(
                                    part["image_url"].as_str().unwrap_or(""),
                                )?),
                                _ => return Err(format!("a bad message part {part:.80}")),
                            }
                        }
                    }
                    other => return Err(format!("a message without content: {other:.80}")),
                },
                other => return Err(format!("a message of role {other:?}")),
            },
            "function_call" | "tool_search_call" => {
                let id = item["call_id"].as_str().unwrap_or("");
                if id.is_empty() || id.chars().count() > OPENAI_MAX_CALL_ID {
                    return Err(format!("a call id of {} characters", id.chars().count()));
                }
                if expected.iter().any(|(e, _)| e == id) {
                    return Err(format!("call id {id} used twice"));
                }
                if kind == "function_call" {
                    let arguments = item["arguments"].as_str().ok_or("arguments not a string")?;
                    if !serde_json::from_str::<Value>(arguments).is_ok_and(|v| v.is_object()) {
                        return Err(format!(
                            "arguments that are not a JSON object: {arguments:.60}"
                        ));
                    }
                    if !name_ok(item["name"].as_str().unwrap_or("")) {
                        return Err(format!("bad call {item:.80}"));
                    }
                } else if item["execution"] != "client" {
                    return Err("a tool_search_call not executed by the client".into());
                }
                expected.push_back((id.to_owned(), kind == "tool_search_call"));
            }
            "function_call_output" => match &item["output"] {
                Value::String(_) => {}
                Value::Array(parts) if !parts.is_empty() => {
                    for part in parts {
                        match part["type"].as_str() {
                            Some("input_text") if part["text"].is_string() => {}
                            Some("input_image") => image_sides
                                .push(check_data_url(part["image_url"].as_str().unwrap_or(""))?),
                            _ => return Err(format!("a bad output part {part:.80}")),
                        }
                    }
                }
                other => return Err(format!("an output that is no text nor parts: {other:.80}")),
            },
            "tool_search_output" => {
                if item["execution"] != "client" {
                    return Err("a tool_search_output not executed by the client".into());
                }
                for tool in item["tools"]
                    .as_array()
                    .ok_or("tool_search_output without tools")?
                {
                    let name = tool["name"].as_str().unwrap_or("");
                    if tool["type"] != "function" || !deferred.contains(name) {
                        return Err(format!(
                            "tool_search_output loads {name:?}, not a deferred tool of the request"
                        ));
                    }
                }
            }
            other => return Err(format!("an input item of type {other:?}")),
        }
    }
    check_image_counts(&image_sides)?;
    if expected.is_empty() {
        Ok(())
    } else {
        Err(format!("unanswered calls {expected:?}"))
    }
}
