//! The rule checker fails on a body breaking each rule it checks: a checker that passed
//! everything would make the property tests that run it worthless.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::rules;

use rules::images;
use serde_json::{Value, json};

fn b64(bytes: &[u8]) -> String {
    psych_types::encode_base64(bytes)
}

fn png_block(bytes: &[u8], media_type: &str) -> Value {
    json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(bytes)}})
}

/// A body every rule accepts: tools, a call answered by a result with text and a real PNG,
/// then the transient message.
fn anthropic_ok() -> Value {
    json!({
        "model": "m", "max_tokens": 10,
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "t", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [
                {"type": "text", "text": "before"},
                png_block(&images::png(2, 2, 1), "image/png"),
                {"type": "text", "text": "after"}]}]},
            {"role": "user", "content": [{"type": "text", "text": "now"}]}
        ]
    })
}

fn openai_ok() -> Value {
    json!({
        "model": "m",
        "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "t", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "[content block #0: image, image/png, 70 bytes]"},
            {"role": "user", "content": [
                {"type": "text", "text": "Images from the tool results above:"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(&images::png(2, 2, 1)))}}]}
        ]
    })
}

fn anthropic(body: &Value) -> Result<(), String> {
    rules::check_anthropic_body(&body.to_string(), true)
}

fn openai(body: &Value) -> Result<(), String> {
    rules::check_openai_body(&body.to_string())
}

/// Applies `break_it` to a copy of the good body and expects an error mentioning `says`.
fn refused(
    good: fn() -> Value,
    check: fn(&Value) -> Result<(), String>,
    says: &str,
    break_it: impl FnOnce(&mut Value),
) {
    let mut body = good();
    break_it(&mut body);
    match check(&body) {
        Err(problem) => assert!(problem.contains(says), "{problem:?} does not say {says:?}"),
        Ok(()) => panic!("accepted a body that should fail on {says:?}: {body:.300}"),
    }
}

#[test]
fn the_good_bodies_pass() {
    assert_eq!(anthropic(&anthropic_ok()), Ok(()));
    assert_eq!(openai(&openai_ok()), Ok(()));
    // Every generated image format sniffs as itself.
    assert_eq!(
        rules::sniff(&images::png(3, 2, 0)),
        Some(("image/png", 3, 2))
    );
    assert_eq!(rules::sniff(&images::jpeg()), Some(("image/jpeg", 8, 8)));
    assert_eq!(rules::sniff(&images::gif()), Some(("image/gif", 1, 1)));
    assert_eq!(
        rules::sniff(&images::webp_header(30, 20)),
        Some(("image/webp", 30, 20))
    );
}

#[test]
fn each_anthropic_rule_fails_a_body_that_breaks_it() {
    let g = anthropic_ok;
    let a = anthropic;
    refused(g, a, "first message", |b| {
        b["messages"].as_array_mut().unwrap().remove(0);
    });
    refused(g, a, "without tools", |b| {
        b.as_object_mut().unwrap().remove("tools");
    });
    refused(g, a, "bad tool name", |b| {
        b["tools"][0]["name"] = json!("a.b")
    });
    refused(g, a, "expected results", |b| {
        b["messages"][2]["content"][0]["tool_use_id"] = json!("c9");
    });
    refused(g, a, "unanswered", |b| {
        b["messages"].as_array_mut().unwrap().truncate(2);
    });
    refused(g, a, "bad tool_use", |b| {
        b["messages"][1]["content"][1]["input"] = json!("not an object");
    });
    refused(g, a, "whitespace", |b| {
        b["messages"][0]["content"][0]["text"] = json!(" \n")
    });
    refused(g, a, "whitespace", |b| {
        b["messages"][2]["content"][0]["content"][0]["text"] = json!("\t");
    });
    refused(g, a, "without content", |b| {
        b["messages"][3]["content"] = json!([])
    });
    refused(g, a, "final assistant content ends in whitespace", |b| {
        let messages = b["messages"].as_array_mut().unwrap();
        messages.truncate(3);
        messages
            .push(json!({"role": "assistant", "content": [{"type": "text", "text": "done \n"}]}));
    });
    refused(
        g,
        a,
        "declared image/jpeg but its bytes are image/png",
        |b| {
            b["messages"][2]["content"][0]["content"][1] =
                png_block(&images::png(2, 2, 1), "image/jpeg");
        },
    );
    refused(g, a, "no image", |b| {
        b["messages"][2]["content"][0]["content"][1] = png_block(b"\x89PNG\r", "image/png");
    });
    refused(g, a, "over 5 MB", |b| {
        let mut big = images::png(1, 1, 0);
        big.resize(4_000_000, 0);
        b["messages"][2]["content"][0]["content"][1] = png_block(&big, "image/png");
    });
    refused(g, a, "9000x2 px", |b| {
        b["messages"][2]["content"][0]["content"][1] =
            png_block(&images::png_header(9000, 2), "image/png");
    });
    refused(g, a, "and one over 2000 px", |b| {
        let inner = b["messages"][2]["content"][0]["content"]
            .as_array_mut()
            .unwrap();
        inner[1] = png_block(&images::png_header(2500, 10), "image/png");
        for _ in 0..20 {
            inner.push(png_block(&images::png(1, 1, 0), "image/png"));
        }
    });
    refused(g, a, "101 images", |b| {
        let inner = b["messages"][2]["content"][0]["content"]
            .as_array_mut()
            .unwrap();
        for _ in 0..100 {
            inner.push(png_block(&images::png(1, 1, 0), "image/png"));
        }
    });
    refused(g, a, "a Some(\"document\") block in a tool_result", |b| {
        b["messages"][2]["content"][0]["content"][1] = json!({"type": "document"});
    });
    refused(g, a, "more than four breakpoints", |b| {
        for i in 0..4 {
            b["messages"][i]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
        }
        b["system"][0]["cache_control"] = json!({"type": "ephemeral"});
    });
    refused(g, a, "transient", |b| {
        b["messages"][3]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    });
    refused(g, a, "a request of", |b| {
        b["messages"][3]["content"][0]["text"] = json!("x".repeat(33 * 1024 * 1024));
    });
}

#[test]
fn each_openai_rule_fails_a_body_that_breaks_it() {
    let g = openai_ok;
    let o = openai;
    refused(g, o, "129 tools", |b| {
        let tools = b["tools"].as_array_mut().unwrap();
        for i in 0..128 {
            tools.push(json!({"type": "function", "function": {"name": format!("t{i}"), "parameters": {}}}));
        }
    });
    refused(g, o, "bad tool name", |b| {
        b["tools"][0]["function"]["name"] = json!("a.b")
    });
    refused(g, o, "not a JSON object", |b| {
        b["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!("{\"q\": ");
    });
    refused(g, o, "not a JSON object", |b| {
        b["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!("[1]");
    });
    refused(g, o, "a call id of 41 characters", |b| {
        let long = "c".repeat(41);
        b["messages"][2]["tool_calls"][0]["id"] = json!(long);
        b["messages"][3]["tool_call_id"] = json!(long);
    });
    refused(g, o, "unexpected tool message", |b| {
        b["messages"][3]["tool_call_id"] = json!("c9")
    });
    refused(g, o, "unanswered", |b| {
        b["messages"].as_array_mut().unwrap().remove(3);
    });
    refused(g, o, "tool content is not a string", |b| {
        b["messages"][3]["content"] = json!([{"type": "text", "text": "x"}]);
    });
    refused(g, o, "without content", |b| {
        b["messages"][1]["content"] = json!("")
    });
    refused(g, o, "bad user content part", |b| {
        b["messages"][4]["content"][0]["text"] = json!("");
    });
    refused(g, o, "image type image/gif not accepted", |b| {
        b["messages"][4]["content"][1]["image_url"]["url"] =
            json!(format!("data:image/gif;base64,{}", b64(&images::gif())));
    });
    refused(
        g,
        o,
        "declared image/webp but its bytes are image/png",
        |b| {
            b["messages"][4]["content"][1]["image_url"]["url"] = json!(format!(
                "data:image/webp;base64,{}",
                b64(&images::png(2, 2, 1))
            ));
        },
    );
    refused(g, o, "no data URL", |b| {
        b["messages"][4]["content"][1]["image_url"]["url"] = json!("https://example.com/a.png");
    });
}

/// A Responses body every rule accepts: a deferred tool with the client tool search, a
/// search answered by loading it, a call to it answered with text and a real PNG.
fn responses_ok() -> Value {
    json!({
        "model": "m",
        "tools": [
            {"type": "function", "name": "t", "parameters": {"type": "object"}, "strict": false},
            {"type": "function", "name": "d", "parameters": {"type": "object"}, "strict": false,
             "defer_loading": true},
            {"type": "tool_search", "execution": "client", "description": "Find tools",
             "parameters": {"type": "object"}}
        ],
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "tool_search_call", "call_id": "s1", "execution": "client",
             "arguments": {"query": "d"}},
            {"type": "tool_search_output", "call_id": "s1", "execution": "client",
             "tools": [{"type": "function", "name": "d", "parameters": {"type": "object"},
                        "strict": false, "defer_loading": true}]},
            {"type": "message", "role": "assistant", "content": "Calling."},
            {"type": "function_call", "call_id": "c1", "name": "d", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "before"},
                {"type": "input_image", "image_url":
                    format!("data:image/png;base64,{}", b64(&images::png(2, 2, 1)))}]},
            {"type": "message", "role": "user", "content": "now"}
        ]
    })
}

fn responses(body: &Value) -> Result<(), String> {
    rules::check_responses_body(&body.to_string())
}

#[test]
fn each_responses_rule_fails_a_body_that_breaks_it() {
    let g = responses_ok;
    let r = responses;
    assert_eq!(r(&g()), Ok(()));
    refused(g, r, "130 tools", |b| {
        let tools = b["tools"].as_array_mut().unwrap();
        for i in 0..127 {
            tools.push(json!({"type": "function", "name": format!("t{i}"), "parameters": {}, "strict": false}));
        }
    });
    refused(g, r, "bad tool name", |b| {
        b["tools"][0]["name"] = json!("a.b")
    });
    refused(g, r, "declared twice", |b| {
        b["tools"][1]["name"] = json!("t")
    });
    refused(g, r, "without parameters or strict", |b| {
        b["tools"][0].as_object_mut().unwrap().remove("strict");
    });
    refused(g, r, "without a tool_search tool", |b| {
        b["tools"].as_array_mut().unwrap().pop();
    });
    refused(g, r, "the tool_search tool is deferred", |b| {
        b["tools"][2]["defer_loading"] = json!(true);
    });
    refused(g, r, "a tool of unknown type", |b| {
        b["tools"][0]["type"] = json!("web_search");
    });
    refused(g, r, "instructions are not a string", |b| {
        b["instructions"] = json!(["Be brief."]);
    });
    refused(g, r, "not a JSON object", |b| {
        b["input"][4]["arguments"] = json!("[1]");
    });
    refused(g, r, "a call id of 41 characters", |b| {
        let long = "c".repeat(41);
        b["input"][4]["call_id"] = json!(long);
        b["input"][5]["call_id"] = json!(long);
    });
    refused(g, r, "unexpected function_call_output", |b| {
        b["input"][5]["call_id"] = json!("c9");
    });
    refused(g, r, "unanswered", |b| {
        b["input"].as_array_mut().unwrap().remove(5);
    });
    refused(g, r, "unanswered", |b| {
        // A message between a call and its output.
        let input = b["input"].as_array_mut().unwrap();
        let output = input.remove(5);
        input.insert(6, output);
    });
    refused(g, r, "unexpected tool_search_output", |b| {
        b["input"][2]["type"] = json!("function_call_output");
        b["input"][2]["output"] = json!("x");
        b["input"][1]["type"] = json!("function_call");
        b["input"][1]["name"] = json!("t");
        b["input"][1]["arguments"] = json!("{}");
        b["input"][2]["type"] = json!("tool_search_output");
    });
    refused(g, r, "not a deferred tool of the request", |b| {
        b["input"][2]["tools"][0]["name"] = json!("t");
    });
    refused(g, r, "not a deferred tool of the request", |b| {
        b["input"][2]["tools"][0]["name"] = json!("absent");
    });
    refused(g, r, "not executed by the client", |b| {
        b["input"][1]["execution"] = json!("server");
    });
    refused(g, r, "an output that is no text nor parts", |b| {
        b["input"][5]["output"] = json!([]);
    });
    refused(g, r, "a bad output part", |b| {
        b["input"][5]["output"][0]["type"] = json!("text");
    });
    refused(g, r, "no data URL", |b| {
        b["input"][5]["output"][1]["image_url"] = json!("https://example.com/a.png");
    });
    refused(g, r, "image type image/gif not accepted", |b| {
        b["input"][5]["output"][1]["image_url"] =
            json!(format!("data:image/gif;base64,{}", b64(&images::gif())));
    });
    refused(g, r, "a message without content", |b| {
        b["input"][0]["content"] = json!("");
    });
    refused(g, r, "a message of role", |b| {
        b["input"][0]["role"] = json!("system")
    });
    refused(g, r, "an input item of type", |b| {
        b["input"][0]["type"] = json!("reasoning");
    });
}

/// An Anthropic body in native deferral: a client search tool, a deferred tool, a search
/// answered by a reference, then a call to the loaded tool.
fn anthropic_native_ok() -> Value {
    json!({
        "model": "m", "max_tokens": 10,
        "tools": [
            {"name": "tool_search", "input_schema": {"type": "object"}},
            {"name": "gh__create_issue", "input_schema": {"type": "object"}, "defer_loading": true}
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "file it"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "s1", "name": "tool_search", "input": {"query": "issue"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "s1", "content": [
                {"type": "tool_reference", "tool_name": "gh__create_issue"}]}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "c1", "name": "gh__create_issue", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [
                {"type": "text", "text": "#12"}]}]},
            {"role": "user", "content": [{"type": "text", "text": "now"}]}
        ]
    })
}

#[test]
fn each_anthropic_deferral_rule_fails_a_body_that_breaks_it() {
    let g = anthropic_native_ok;
    let a = anthropic;
    assert_eq!(a(&g()), Ok(()));
    let mut server = g();
    server["tools"][0] =
        json!({"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"});
    assert_eq!(a(&server), Ok(()));
    refused(g, a, "not a deferred tool of the request", |b| {
        b["messages"][2]["content"][0]["content"][0]["tool_name"] = json!("tool_search");
    });
    refused(g, a, "not a deferred tool of the request", |b| {
        b["messages"][2]["content"][0]["content"][0]["tool_name"] = json!("gh__delete_repo");
    });
    refused(g, a, "deferred tools without a search tool", |b| {
        b["tools"][0]["name"] = json!("read_file");
    });
    refused(g, a, "the search tool is deferred", |b| {
        b["tools"][0] = json!({"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex", "defer_loading": true});
        b["tools"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "t", "input_schema": {}}));
    });
    refused(g, a, "declared twice", |b| {
        b["tools"][1]["name"] = json!("tool_search");
    });
}
