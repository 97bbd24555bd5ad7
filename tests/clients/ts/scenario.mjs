#!/usr/bin/env node
// A real MCP client (the TypeScript SDK, `@modelcontextprotocol/client@2.4.0`) driving
// `psych serve`. Run by `cli/tests/serve_clients.rs` once `cargo xtask clients` has run
// `npm ci` here. The same scenario as `tests/clients/py/scenario.py`; against a gateway
// whose config has a direct server (`--direct`, default `up`) and a deferred one
// (`--deferred`, default `deferred`):
//
//   1. list the tools (waiting until every upstream is listed);
//   2. call a direct tool (`<direct>__echo`);
//   3. list -> describe -> call `echo` of the deferred server through the meta tools;
//   4. a large call (`<direct>__large`) whose result is elided: prints `{"handle": ...}` on
//      stdout as soon as it has it, reads the handle back on the same connection, reads the
//      whole result through the preview's `resource_link` (`resources/read`), and hands one
//      line of it to `<direct>__echo` by reference (`{"$psych_result": handle, ...}`);
//   5. trigger `<direct>__add_tool` and wait (10 s) for `notifications/tools/list_changed`
//      (legacy: the notification handler; modern: delivered through `client.listen`),
//      then find the new tool listed.
//
// With `--read HANDLE --expect-prefix TEXT` it instead opens a NEW connection and calls
// `read_tool_output` on HANDLE (with `--grep` if given), checking that a line of the
// answer (its line-number gutter removed) starts with TEXT.
//
// `--mode legacy` is the SDK's default negotiation (the 2025 `initialize` handshake);
// `--mode modern` pins 2026-07-28 (`versionNegotiation: {mode: {pin: '2026-07-28'}}`).
// The last line on stdout is a JSON summary (`{"ok": true|false, "sdk": ...}`); on failure
// it names the step and the error (with the JSON-RPC code and data when there is one), and
// the exit status is 1. Usage errors exit 2.
//
//   node scenario.mjs --transport stdio --mode legacy --command PSYCH serve --config F --dir D
//   node scenario.mjs --transport http --mode modern --url http://127.0.0.1:PORT/mcp [--token T]

import { readFileSync } from 'node:fs';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const MODERN = '2026-07-28';
const HANDLE = /handle "([^"]+)"/;
const READY_WITHIN_MS = 60_000;
const CHANGED_WITHIN_MS = 10_000;
const VERSION = JSON.parse(
    readFileSync(new URL('./node_modules/@modelcontextprotocol/client/package.json', import.meta.url))
).version;
const SDK = `typescript @modelcontextprotocol/client@${VERSION}`;

class Failure extends Error {}

const log = message => process.stderr.write(`scenario.mjs: ${message}\n`);
const emit = value => process.stdout.write(`${JSON.stringify(value)}\n`);
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function usage(message) {
    process.stderr.write(
        `scenario.mjs: ${message}\nusage: node scenario.mjs --transport stdio|http --mode modern|legacy ` +
            `[--url URL] [--token T] [--direct NAME] [--deferred NAME] ` +
            `[--read HANDLE --expect-prefix TEXT [--grep G]] [--command PSYCH serve ...]\n`
    );
    process.exit(2);
}

function parse(argv) {
    const args = { direct: 'up', deferred: 'deferred' };
    const flags = {
        '--transport': 'transport',
        '--mode': 'mode',
        '--url': 'url',
        '--token': 'token',
        '--direct': 'direct',
        '--deferred': 'deferred',
        '--read': 'read',
        '--grep': 'grep',
        '--expect-prefix': 'expectPrefix'
    };
    for (let i = 0; i < argv.length; i++) {
        const flag = argv[i];
        if (flag === '--command') {
            args.command = argv.slice(i + 1);
            break;
        }
        const key = flags[flag];
        if (key === undefined || i + 1 >= argv.length) usage(`unknown flag or missing value: ${flag}`);
        args[key] = argv[++i];
    }
    if (!['stdio', 'http'].includes(args.transport)) usage('--transport stdio|http is required');
    if (!['modern', 'legacy'].includes(args.mode)) usage('--mode modern|legacy is required');
    if (args.transport === 'stdio' && !(args.command && args.command.length)) usage('--transport stdio needs --command');
    if (args.transport === 'http' && !args.url) usage('--transport http needs --url');
    if (args.token && args.transport !== 'http') usage('--token is sent over HTTP only');
    if (args.read && !args.expectPrefix) usage('--read needs --expect-prefix');
    return args;
}

/** The error as JSON: its type, message, and the JSON-RPC or SDK code and data if any. */
function describeError(error) {
    if (!(error instanceof Error)) return { type: typeof error, message: String(error) };
    const described = { type: error.constructor?.name ?? error.name, message: error.message };
    if (error.code !== undefined) described.code = error.code;
    if (error.data !== undefined) described.data = error.data;
    if (error.cause !== undefined) described.cause = describeError(error.cause);
    return described;
}

/** The result's text blocks, or its structured content's JSON when it has no text. */
function text(result) {
    const shown = (result.content ?? []).map(block => block.text ?? '').join('');
    if (!shown && result.structuredContent !== undefined) return JSON.stringify(result.structuredContent);
    return shown;
}

class Scenario {
    constructor(args) {
        this.args = args;
        this.current = 'connect';
        this.notified = 0;
        this.waiters = [];
        this.steps = [];
        this.summary = { sdk: SDK, transport: args.transport, mode: args.mode, steps: this.steps };
    }

    async connect() {
        const { args } = this;
        const options = args.mode === 'modern' ? { versionNegotiation: { mode: { pin: MODERN } } } : {};
        const client = new Client({ name: 'psych-scenario-ts', version: '0' }, options);
        client.setNotificationHandler('notifications/tools/list_changed', () => {
            this.notified += 1;
            for (const wake of this.waiters.splice(0)) wake();
        });
        let transport;
        if (args.transport === 'stdio') {
            const [command, ...rest] = args.command;
            transport = new StdioClientTransport({ command, args: rest, stderr: 'inherit' });
        } else {
            const headers = args.token ? { Authorization: `Bearer ${args.token}` } : {};
            transport = new StreamableHTTPClientTransport(new URL(args.url), { requestInit: { headers } });
        }
        await client.connect(transport);
        this.client = client;
        this.summary.protocol_version = client.getNegotiatedProtocolVersion() ?? null;
        this.summary.era = client.getProtocolEra() ?? null;
        this.summary.server = client.getServerVersion()?.name ?? null;
        return client;
    }

    async close() {
        if (!this.client) return;
        // Bounded: a gateway that does not let go must not hold the summary back.
        const closing = this.client.close().catch(e => log(`close: ${e}`));
        await Promise.race([closing, sleep(5000).then(() => log('close: still closing after 5 s'))]);
    }

    async call(name, args) {
        const result = await this.client.callTool({ name, arguments: args });
        if (result.isError) throw new Failure(`${name} ${JSON.stringify(args)}: a tool error: ${text(result)}`);
        return result;
    }

    async listAll() {
        // No argument: the SDK walks every page. 'refresh': always ask the gateway.
        const { tools } = await this.client.listTools(undefined, { cacheMode: 'refresh' });
        return tools;
    }

    step(name, facts = {}) {
        this.steps.push({ step: name, ok: true, ...facts });
        log(`${name}: ok ${JSON.stringify(facts)}`);
    }

    async waitReady() {
        const deadline = Date.now() + READY_WITHIN_MS;
        for (;;) {
            const tools = await this.listAll();
            if (!JSON.stringify(tools).includes('not listed yet')) return tools;
            if (Date.now() > deadline) throw new Failure('an upstream is still "not listed yet" after 60 s');
            await sleep(200);
        }
    }

    async run() {
        const { direct, deferred, transport } = this.args;
        await this.connect();

        this.current = 'list';
        const names = (await this.waitReady()).map(tool => tool.name);
        for (const name of [
            `${direct}__echo`,
            `${direct}__large`,
            `${direct}__add_tool`,
            'psych_list_tools',
            'psych_describe_tool',
            'psych_call_tool',
            'read_tool_output'
        ]) {
            if (!names.includes(name)) throw new Failure(`${name} is not listed: ${JSON.stringify(names)}`);
        }
        const own = names.filter(name => name.startsWith(`${deferred}__`));
        if (own.length) throw new Failure(`the deferred server ${deferred} has tools listed directly: ${own}`);
        this.step('list', { tools: names.length });

        this.current = 'direct';
        let said = `hello from ${SDK} over ${transport}`;
        let echoed = text(await this.call(`${direct}__echo`, { text: said }));
        if (echoed !== said) throw new Failure(`${direct}__echo answered ${JSON.stringify(echoed)}, not ${said}`);
        this.step('direct', { tool: `${direct}__echo` });

        this.current = 'deferred';
        const listing = text(await this.call('psych_list_tools', { server: deferred }));
        if (!listing.replaceAll(' ', '').includes('"name":"echo"')) {
            throw new Failure(`psych_list_tools ${deferred}: no echo in ${listing.slice(0, 2000)}`);
        }
        const described = text(await this.call('psych_describe_tool', { server: deferred, tool: 'echo' }));
        if (!described.includes('Answers the text')) {
            throw new Failure(`psych_describe_tool ${deferred} echo: ${described.slice(0, 2000)}`);
        }
        said = 'hello, deferred';
        echoed = text(await this.call('psych_call_tool', { server: deferred, tool: 'echo', arguments: { text: said } }));
        if (echoed !== said) throw new Failure(`psych_call_tool ${deferred} echo answered ${JSON.stringify(echoed)}`);
        this.step('deferred', { server: deferred });

        this.current = 'elided';
        const large = await this.call(`${direct}__large`, { bytes: 200_000 });
        const shown = text(large);
        if (shown.length >= 10_000) throw new Failure(`${direct}__large was not elided: ${shown.length} characters`);
        if (!shown.startsWith('line 000001: the quick brown fox')) {
            throw new Failure(`${direct}__large: the elided text starts ${JSON.stringify(shown.slice(0, 200))}`);
        }
        const found = HANDLE.exec(shown);
        if (!found) throw new Failure(`${direct}__large: no handle in ${JSON.stringify(shown.slice(-1000))}`);
        const handle = found[1];
        this.summary.handle = handle;
        emit({ handle });
        const read = text(await this.call('read_tool_output', { handle, grep: 'line 002345:' }));
        if (!read.includes('line 002345: the quick brown fox jumps over the lazy dog')) {
            throw new Failure(`read_tool_output ${handle} on the same connection: ${read.slice(0, 2000)}`);
        }
        // The preview links the whole result, which resources/read serves.
        const links = (large.content ?? []).filter(block => block.type === 'resource_link').map(block => block.uri);
        if (links.length !== 1) throw new Failure(`${direct}__large: ${links.length} resource links`);
        const whole = await this.client.readResource({ uri: links[0] });
        const body = whole.contents.map(c => c.text ?? '').join('');
        if (body.length !== 200_000 || !body.includes('line 002345: the quick brown fox')) {
            throw new Failure(`resources/read ${links[0]}: ${body.length} characters`);
        }
        // A line of it handed to another tool by reference.
        const passed = text(
            await this.call(`${direct}__echo`, { text: { $psych_result: handle, offset: 2344, limit: 1 } }),
        );
        this.step('elided', { handle, shown_chars: shown.length, resource_chars: body.length, passed });

        this.current = 'list_changed';
        await this.listChanged();
    }

    /** Resolves at the next list_changed (whichever way it arrived). */
    nextChange() {
        return new Promise(resolve => this.waiters.push(resolve));
    }

    async listChanged() {
        const { direct, mode, transport } = this.args;
        const fresh = `fresh_ts_${mode}_${transport}_${process.pid}`;
        let subscription;
        if (mode === 'modern') {
            // Change notifications on the stream dispatch to setNotificationHandler.
            subscription = await this.client.listen({ toolsListChanged: true });
            this.summary.listen_honored = subscription.honoredFilter;
        }
        try {
            let change = this.nextChange();
            await this.call(`${direct}__add_tool`, { name: fresh });
            const started = Date.now();
            const deadline = started + CHANGED_WITHIN_MS;
            for (;;) {
                const left = deadline - Date.now();
                const heard = await Promise.race([change.then(() => true), sleep(Math.max(left, 0)).then(() => false)]);
                if (!heard) {
                    const how = mode === 'modern' ? 'client.listen' : 'the notification handler';
                    throw new Failure(
                        `no notifications/tools/list_changed naming ${direct}__${fresh} through ${how} ` +
                            `within ${CHANGED_WITHIN_MS / 1000} s`
                    );
                }
                change = this.nextChange();
                const names = (await this.listAll()).map(tool => tool.name);
                if (names.includes(`${direct}__${fresh}`)) break;
                // An earlier change (not ours): wait for the next one.
            }
            this.summary.list_changed_after_s = (Date.now() - started) / 1000;
        } finally {
            if (subscription) await subscription.close();
        }
        this.step('list_changed', { added: `${direct}__${fresh}`, notifications: this.notified });
    }

    async read() {
        const { read: handle, grep, expectPrefix } = this.args;
        await this.connect();
        this.current = 'read';
        const args = { handle };
        if (grep) args.grep = grep;
        const shown = text(await this.call('read_tool_output', args));
        // Each shown line is `<number>\t<line>`: the reader's gutter comes off.
        const lines = shown.split('\n').map(line => line.replace(/^\s*\d+\t/, ''));
        if (!lines.some(line => line.startsWith(expectPrefix))) {
            throw new Failure(
                `read_tool_output ${JSON.stringify(args)} on a new connection: no line starts with ` +
                    `${JSON.stringify(expectPrefix)} in ${JSON.stringify(shown.slice(0, 2000))}`
            );
        }
        this.summary.handle = handle;
        this.step('read', { handle, chars: shown.length });
    }
}

async function main() {
    const args = parse(process.argv.slice(2));
    const scenario = new Scenario(args);
    let status = 0;
    try {
        if (args.read) await scenario.read();
        else await scenario.run();
        scenario.summary.ok = true;
    } catch (error) {
        const described = describeError(error);
        Object.assign(scenario.summary, { ok: false, failed_step: scenario.current, error: described });
        log(`FAILED at step ${scenario.current}: ${JSON.stringify(described)}`);
        if (process.env.SCENARIO_TRACEBACK) log(error?.stack ?? '');
        status = 1;
    }
    await scenario.close();
    emit(scenario.summary);
    // A stdio child or an HTTP keep-alive must not hold the exit.
    process.exit(status);
}

await main();
