#!/usr/bin/env python3
"""Gathers the estimator's multilingual and tool-output corpus from this machine.

Writes `text/fit/<type>/<source>.txt` and `text/held/<type>/<source>.txt` beside this
script. Each content type has several *sources* (a gettext catalogue, a man page, a
directory listed, a binary dumped...); the sources of a type are sorted by name and dealt
alternately into the fitting half and the held-out half, before any fitting. Each source
is cut to at most LIMIT bytes on a line boundary (a line boundary is a char boundary).

Run on a Debian 12 machine with man, groff, gettext data, xxd, hexdump, util-linux
(unshare) and the packages listed in README.md; the output is committed, so CI needs none
of this. Re-running it on another machine gives other bytes (other packages, times, ids):
commit the new corpus and re-fit together.
"""

import gettext
import glob
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "text")
LIMIT = 8 * 1024
SOURCES_PER_HALF = 3
REGISTRY = glob.glob(os.path.expanduser("~/.cargo/registry/src/index.crates.io-*"))[0]
RUST_DOCS = os.path.expanduser(
    "~/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/share/doc/rust/html"
)


def cut(text, limit=LIMIT):
    """At most `limit` UTF-8 bytes of `text`, ending on a line boundary when one exists."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    head = data[:limit]
    nl = head.rfind(b"\n")
    if nl > limit // 2:
        head = head[: nl + 1]
    return head.decode("utf-8", errors="ignore")


def sh(cmd, **kw):
    return subprocess.run(
        cmd, shell=True, capture_output=True, check=False, **kw
    ).stdout.decode("utf-8", errors="replace")


def read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def emit(kind, sources):
    """Deals `sources` (name, text) of one type into the two halves, alternately."""
    seen, unique = set(), []
    for n, t in sorted(sources):
        t = cut(t)
        if len(t.encode()) >= 3 * 1024 and t[:2000] not in seen:
            seen.add(t[:2000])
            unique.append((n, t))
    sources = unique
    need = 2 * SOURCES_PER_HALF
    if len(sources) < 2:
        print(f"skip {kind}: {len(sources)} usable sources", file=sys.stderr)
        return
    sources = sources[:need]
    for i, (name, text) in enumerate(sources):
        half = "fit" if i % 2 == 0 else "held"
        folder = os.path.join(OUT, half, kind)
        os.makedirs(folder, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
        with open(os.path.join(folder, safe + ".txt"), "w", encoding="utf-8") as f:
            f.write(text)
    print(f"{kind}: {[n for n, _ in sources]}", file=sys.stderr)


def mo_text(path):
    """The translations (msgstr) of a gettext catalogue, one per line, in msgid order."""
    with open(path, "rb") as f:
        try:
            catalog = gettext.GNUTranslations(f)._catalog
        except Exception:
            return ""
    lines = []
    for key, value in catalog.items():
        if key == "" or not isinstance(value, str):
            continue
        lines.append(value)
    return "\n".join(lines) + "\n"


def gettext_sources(lang):
    paths = sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo"))
    # The larger catalogues carry real sentences; spread the pick over the alphabet.
    sized = [(os.path.getsize(p), p) for p in paths]
    sized.sort(reverse=True)
    big = sorted(p for _, p in sized[:12])
    out = []
    for p in big:
        text = mo_text(p)
        if len(text.encode()) >= 6 * 1024:
            out.append((os.path.basename(p)[:-3], text))
    # Take sources from across the alphabet so the halves differ in domain.
    return out[: 2 * SOURCES_PER_HALF]


def man_text(path):
    env = dict(os.environ, MANWIDTH="80", LANG="C.UTF-8", LC_ALL="C.UTF-8")
    text = subprocess.run(
        ["man", "--encoding=UTF-8", "-l", path],
        capture_output=True,
        env=env,
        check=False,
    ).stdout
    text = subprocess.run(["col", "-b"], input=text, capture_output=True, env=env).stdout
    return text.decode("utf-8", errors="replace")


def man_sources(lang, names):
    out = []
    for name in names:
        found = sorted(glob.glob(f"/usr/share/man/{lang}/man*/{name}.*"))
        if found:
            text = man_text(found[0])
            if len(text.encode()) >= 6 * 1024:
                out.append((f"{name}", text))
    return out


def files(pattern_list, min_size=4 * 1024):
    out = []
    for pattern in pattern_list:
        for p in sorted(glob.glob(pattern, recursive=True)):
            if os.path.isfile(p) and os.path.getsize(p) >= min_size:
                out.append(p)
                break
    return out


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)

    # Scripts and languages: gettext catalogues.
    for lang in [
        "ru", "uk", "bg", "sr", "el", "ar", "fa", "he", "hi", "mr", "ne", "bn", "pa",
        "gu", "or", "ta", "te", "kn", "ml", "si", "th", "km", "my", "ka", "hy", "am",
        "dz", "zh_CN", "zh_TW", "ja", "ko", "vi", "pl", "cs", "tr", "hu", "de", "fr",
        "es",
    ]:
        emit(f"gettext-{lang}", gettext_sources(lang))

    # Man pages, rendered as `man` shows them (80 columns).
    man_names = [
        "apt-get", "bash", "chmod", "cp", "crontab", "dpkg", "find", "grep", "ls",
        "mount", "passwd", "ps", "rsync", "sed", "su", "tar", "top", "useradd",
        "apt", "apt-cache", "dpkg-query", "login", "kill", "mv", "rm", "sudo", "locale",
        "man", "less", "debconf", "adduser", "deluser", "du", "df", "sort", "uniq",
    ]
    for lang in ["de", "fr", "ru", "uk", "pl", "ja", "zh_CN", "ko", "nl"]:
        pages = man_sources(lang, man_names)
        # One source per page; keep pages from across the list.
        emit(f"man-{lang}", pages[: 2 * SOURCES_PER_HALF])
    en = []
    for name in ["tar", "rsync", "find", "ssh", "grep", "curl", "git-log", "sed", "bash", "gpg"]:
        found = sorted(glob.glob(f"/usr/share/man/man1/{name}.1*"))
        if found:
            en.append((name, man_text(found[0])))
    emit("man-en", en)

    # Process listings, in a PID namespace of our own processes (the host's process
    # list is not ours to publish).
    script = r"""
        sleep 3600 & sleep 7200 & tail -f /dev/null &
        python3 -m http.server 18931 --bind 127.0.0.1 >/dev/null 2>&1 &
        python3 -c 'import time; time.sleep(3600)' &
        bash -c 'while true; do sleep 5; done' &
        sh -c 'cat /dev/zero | head -c 1 >/dev/null; sleep 3000' &
        perl -e 'sleep 3600' &
        xargs -0 sleep </dev/null &
        find / -xdev -name '*.nonexistent' >/dev/null 2>&1 &
        sleep 1
        ps %s
        kill $(jobs -p) 2>/dev/null
    """
    ps_sources = []
    for name, args in [
        ("ps_aux", "aux"),
        ("ps_ef_forest", "-ef --forest"),
        ("ps_eLf", "-eLf"),
        ("ps_eo_long", "-eo pid,ppid,user,stat,pcpu,pmem,vsz,rss,lstart,etime,args"),
    ]:
        text = sh(f"unshare --pid --fork --mount-proc bash -c {shlex.quote(script % args)}")
        # Kernel threads of the host are harmless and make the list realistic in length.
        text += sh(
            "ps -eo user,pid,pcpu,pmem,vsz,rss,tty,stat,start,time,comm | awk '$11 ~ /^\\[?k|^kworker|^rcu|^ksoftirq|^migration|^cpuhp|^idle_inject/'"
        )
        ps_sources.append((name, text))
    emit("ps", ps_sources)

    emit(
        "ls-laR",
        [
            ("usr_share_doc", sh("ls -laR /usr/share/doc | head -c 20000")),
            ("etc", sh("ls -laR /etc 2>/dev/null | head -c 20000")),
            ("usr_include", sh("ls -laR /usr/include | head -c 20000")),
            ("usr_lib_python3", sh("ls -laR /usr/lib/python3/dist-packages | head -c 20000")),
        ],
    )
    emit(
        "dpkg-l",
        [
            ("lib", sh("COLUMNS=160 dpkg -l 'lib*' | head -c 20000")),
            ("a-k", sh("COLUMNS=160 dpkg -l '[a-k]*' | head -c 20000")),
            ("m-z", sh("COLUMNS=160 dpkg -l '[m-z]*' | head -c 20000")),
            ("python", sh("COLUMNS=160 dpkg -l 'python*' | head -c 20000")),
        ],
    )
    status = read("/var/lib/dpkg/status").split("\n\n")
    emit(
        "dpkg-status",
        [
            ("part1", "\n\n".join(status[0:60])),
            ("part2", "\n\n".join(status[200:260])),
            ("part3", "\n\n".join(status[400:460])),
            ("part4", "\n\n".join(status[600:660])),
        ],
    )
    emit(
        "logs",
        [
            ("dpkg.log", read("/var/log/dpkg.log")[-30000:]),
            ("apt_history.log", read("/var/log/apt/history.log")),
            ("alternatives.log", read("/var/log/alternatives.log")),
            ("postgresql", read("/var/log/postgresql/postgresql-15-main.log")),
            ("apt_term.log", read("/var/log/apt/term.log")),
        ],
    )
    emit(
        "csv",
        [
            ("dpkg_query", sh("dpkg-query -W -f='\"${Package}\",\"${Version}\",${Architecture},${Installed-Size},\"${Maintainer}\"\\n' | head -c 20000")),
            ("find_usr_share", sh("find /usr/share/zoneinfo -printf '%p,%s,%TY-%Tm-%Td %TH:%TM,%m,%u\\n' | sort | head -c 20000")),
            ("distro_info", read("/usr/share/distro-info/ubuntu.csv") + read("/usr/share/distro-info/debian.csv")),
            ("iso_codes", sh("python3 -c \"import json,csv,sys; d=json.load(open('/usr/share/iso-codes/json/iso_639-3.json'))['639-3']; w=csv.writer(sys.stdout); [w.writerow([x.get('alpha_3'),x.get('alpha_2',''),x.get('name'),x.get('scope'),x.get('type')]) for x in d[:400]]\"")),
        ],
    )
    emit(
        "tsv",
        [
            ("dpkg_query", sh("dpkg-query -W -f='${Package}\\t${Version}\\t${Installed-Size}\\t${Priority}\\t${Section}\\n' | head -c 20000")),
            ("zone1970", read("/usr/share/zoneinfo/zone1970.tab")),
            ("jsonb_corpus", read(f"{REGISTRY}/jsonschema-value-0.61.2/tests/fixtures/jsonb-corpus.tsv")),
            ("stat_usr_bin", sh("stat -c '%n\t%s\t%b\t%f\t%u\t%g\t%i\t%h\t%Y' /usr/bin/* | head -c 20000")),
        ],
    )
    emit(
        "hexdump-C",
        [
            (p.replace("/", "_"), sh(f"hexdump -C -s 4096 -n 2048 {p}"))
            for p in ["/usr/bin/ls", "/usr/bin/cat", "/usr/bin/xxd", "/usr/lib/x86_64-linux-gnu/libz.so.1"]
        ],
    )
    emit(
        "xxd",
        [
            (p.replace("/", "_"), sh(f"xxd -s 8192 -l 2048 {p}"))
            for p in ["/usr/bin/grep", "/usr/bin/tar", "/usr/bin/sed", "/usr/bin/gzip"]
        ],
    )
    emit(
        "sha256sum",
        [
            ("usr_bin", sh("cd /usr/bin && sha256sum $(ls | head -150)")),
            ("usr_lib", sh("cd /usr/lib/x86_64-linux-gnu && sha256sum $(ls -p | grep -v / | head -150)")),
            # World-readable files only (not /etc/shadow's hash).
            ("etc", sh("cd /etc && sha256sum $(find . -maxdepth 1 -type f -perm -o+r | sort | head -150) 2>/dev/null")),
            ("usr_sbin", sh("cd /usr/sbin && sha256sum $(ls | head -150)")),
        ],
    )
    md5 = sorted(glob.glob("/var/lib/dpkg/info/*.md5sums"))
    emit(
        "md5sums",
        [
            (os.path.basename(p), read(p))
            for p in [m for m in md5 if os.path.getsize(m) >= 4096][:4]
        ],
    )
    rng = random.Random(0x9)
    emit(
        "uuids",
        [
            (f"list{i}", "".join(read("/proc/sys/kernel/random/uuid") for _ in range(260)))
            for i in range(4)
        ],
    )

    # JSON, pretty and compact, from real JSON files.
    json_files = [
        "/usr/share/iso-codes/json/iso_3166-1.json",
        "/usr/share/iso-codes/json/iso_4217.json",
        "/usr/share/iso-codes/json/iso_639-5.json",
        "/usr/share/iso-codes/json/iso_15924.json",
    ]
    pretty, compact = [], []
    for p in json_files:
        value = json.load(open(p, encoding="utf-8"))
        name = os.path.basename(p)
        pretty.append((name, json.dumps(value, indent=2, ensure_ascii=False)))
        compact.append((name, json.dumps(value, separators=(",", ":"), ensure_ascii=False)))
    emit("json-pretty", pretty)
    emit("json-compact", compact)
    schemas = sorted(glob.glob(f"{REGISTRY}/jsonschema-*/tests/**/*.json", recursive=True))
    schemas = [s for s in schemas if os.path.getsize(s) > 12000][:4]
    emit(
        "json-compact-schemas",
        [
            (os.path.basename(s), json.dumps(json.load(open(s)), separators=(",", ":"), ensure_ascii=False))
            for s in schemas
        ],
    )

    xml = [
        "/usr/share/mime/packages/freedesktop.org.xml",
        *files(["/usr/share/xml/**/*.xml"]),
        *files(["/usr/share/dbus-1/**/*.conf"], 2048),
        *files(["/etc/fonts/fonts.conf"], 2048),
    ]
    emit("xml", [(p.replace("/", "_"), read(p)) for p in xml])

    html = [
        f"{RUST_DOCS}/std/vec/struct.Vec.html",
        f"{RUST_DOCS}/book/ch04-01-what-is-ownership.html",
        f"{RUST_DOCS}/std/collections/index.html",
        f"{RUST_DOCS}/reference/expressions.html",
    ]
    emit("html", [(p.replace(RUST_DOCS, "").replace("/", "_"), read(p)) for p in html])

    js = [
        f"{RUST_DOCS}/book/elasticlunr-ef4e11c1.min.js",
        f"{RUST_DOCS}/book/mark-09e88c2c.min.js",
        *sorted(glob.glob(f"{RUST_DOCS}/static.files/main-*.js"))[:1],
        *sorted(glob.glob(f"{RUST_DOCS}/static.files/search-*.js"))[:1],
        f"{RUST_DOCS}/book/clipboard-1626706a.min.js",
    ]
    emit("js-minified", [(os.path.basename(p), read(p)[5000:]) for p in js if os.path.exists(p)])

    emit(
        "c-headers",
        [(p.replace("/", "_"), read(p)) for p in [
            "/usr/include/stdio.h", "/usr/include/pthread.h",
            "/usr/include/x86_64-linux-gnu/bits/socket.h", "/usr/include/zlib.h",
        ] if os.path.exists(p)],
    )
    c_src = [
        os.path.expanduser("~/.pyenv/versions/3.7.16/lib/python3.7/distutils/tests/xxmodule.c"),
        "/usr/share/doc/liblzma-dev/examples/03_compress_custom.c",
        f"{REGISTRY}/fancy-regex-0.20.2/tests/oniguruma/test_utf8.c",
        "/usr/share/doc/liblzma-dev/examples/02_decompress.c",
    ]
    emit("c-sources", [(os.path.basename(p), read(p)) for p in c_src if os.path.exists(p)])
    emit(
        "tab-indented",
        [
            ("linux_input.h", read("/usr/include/linux/input.h")),
            ("makefiles", "".join(read(p) for p in sorted(glob.glob("/usr/share/doc/**/Makefile", recursive=True)))),
            ("linux_perf_event.h", read("/usr/include/linux/perf_event.h")),
            ("go_persistent_https", "".join(read(p) for p in sorted(glob.glob("/usr/share/doc/git/contrib/persistent-https/*.go")))),
        ],
    )
    rust = [
        f"{REGISTRY}/serde_json-1.0.145/src/de.rs",
        f"{REGISTRY}/memchr-2.7.6/src/memchr.rs",
        f"{REGISTRY}/thiserror-2.0.17/src/lib.rs",
        f"{REGISTRY}/proptest-1.9.0/src/strategy/traits.rs",
    ]
    rust = [p for p in rust if os.path.exists(p)] or []
    if len(rust) < 4:
        for crate in ["serde_json-", "memchr-", "regex-syntax-", "proptest-", "tokio-"]:
            found = sorted(glob.glob(f"{REGISTRY}/{crate}*/src/*.rs"), key=os.path.getsize)
            if found:
                rust.append(found[-1])
    emit("rust-sources", [(p.split("/")[-3] + "_" + os.path.basename(p), read(p)) for p in rust])
    py = [
        "/usr/lib/python3/dist-packages/apt/package.py",
        "/usr/lib/python3.11/json/decoder.py",
        "/usr/lib/python3.11/argparse.py",
        "/usr/lib/python3.11/shutil.py",
    ]
    emit("python", [(os.path.basename(p), read(p)[3000:]) for p in py if os.path.exists(p)])
    shells = [
        "/usr/bin/gettext.sh", "/usr/bin/dpkg-maintscript-helper", "/usr/bin/ldd",
        "/usr/bin/lesspipe",
    ]
    emit("shell", [(os.path.basename(p), read(p)) for p in shells if os.path.exists(p)])
    sql = sorted(glob.glob("/usr/share/postgresql/*/extension/*.sql"), key=os.path.getsize)[-4:]
    emit("sql", [(os.path.basename(p), read(p)) for p in sql])
    md = [
        f"{REGISTRY}/tokio-1.48.0/CHANGELOG.md",
        f"{REGISTRY}/serde-1.0.228/README.md",
        f"{REGISTRY}/regex-1.12.2/CHANGELOG.md",
        f"{REGISTRY}/criterion-0.8.1/CHANGELOG.md",
    ]
    md = [p for p in md if os.path.exists(p)]
    if len(md) < 4:
        md += sorted(glob.glob(f"{REGISTRY}/*/CHANGELOG.md"), key=os.path.getsize)[-4:]
    emit("markdown", [(p.split("/")[-2] + "_" + os.path.basename(p), read(p)[:40000]) for p in md])
    emit(
        "conf",
        [(os.path.basename(p), read(p)) for p in [
            "/etc/postgresql/15/main/postgresql.conf", "/etc/sensors3.conf",
            "/etc/ssl/openssl.cnf", "/etc/login.defs",
        ] if os.path.exists(p)],
    )
    pems = sorted(glob.glob("/etc/ssl/certs/*.pem"))
    emit(
        "pem",
        [(f"certs{i}", "".join(read(p) for p in pems[i * 6:(i + 1) * 6])) for i in range(4)],
    )
    emit(
        "git-log-patch",
        [
            ("pyenv_recent", sh("git -C ~/.pyenv log -p -n 40 --no-color -- libexec | head -c 30000")),
            ("pyenv_plugins", sh("git -C ~/.pyenv log -p -n 40 --no-color -- plugins/python-build/bin | head -c 30000")),
            ("pyenv_tests", sh("git -C ~/.pyenv log -p -n 40 --no-color -- test | head -c 30000")),
            ("pyenv_docs", sh("git -C ~/.pyenv log -p -n 40 --no-color -- '*.md' | head -c 30000")),
        ],
    )

    # Deep-indented YAML: real YAML files, the most deeply indented ones found.
    yamls = []
    for p in glob.glob("/usr/lib/google-cloud-sdk/**/*.yaml", recursive=True):
        try:
            size = os.path.getsize(p)
        except OSError:
            continue
        if size < 8 * 1024:
            continue
        text = read(p)
        depth = sum(len(l) - len(l.lstrip(" ")) for l in text.splitlines()) / max(1, text.count("\n"))
        yamls.append((depth, p))
    yamls.sort(reverse=True)
    picked = sorted(p for _, p in yamls[:4])
    emit("yaml-deep", [(p.split("/")[-2] + "_" + os.path.basename(p), read(p)) for p in picked])

    # Emoji chat (the one synthetic type: no real chat log is on this machine): real
    # sentences (man page lines, other pages in each half) with emoji, mostly the common
    # faces, hands and hearts, some from anywhere in the emoji blocks, skin tones, ZWJ
    # sequences and flags.
    import unicodedata

    common = [chr(c) for c in range(0x1F600, 0x1F650)] + [
        "\U0001F44D", "\u2764\ufe0f", "\U0001F525", "\U0001F389", "\u2705", "\U0001F680",
        "\U0001F440", "\U0001F64F", "\U0001F44F", "\U0001F4AF", "\u2728", "\U0001F914",
        "\U0001F923", "\U0001F970", "\U0001F60D", "\U0001F622", "\U0001F605", "\U0001F44B",
    ]
    anywhere = [
        chr(c) for c in range(0x1F300, 0x1FAFF)
        if unicodedata.name(chr(c), "") and unicodedata.category(chr(c)) == "So"
    ]
    zwj = [
        "\U0001F469\u200D\U0001F4BB", "\U0001F468\u200D\U0001F469\u200D\U0001F467",
        "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F9D1\u200D\U0001F680",
        "\U0001F44D\U0001F3FD", "\U0001F64F\U0001F3FB", "\U0001F1E9\U0001F1EA",
        "\U0001F1EF\U0001F1F5", "\U0001F1FA\U0001F1E6", "\U0001F1E7\U0001F1F7",
    ]
    chats = []
    names = ["alice", "bob", "chen", "dana", "emre", "fatima"]
    for i, page in enumerate(["tar", "find", "grep", "curl"]):
        lines = [
            l.strip() for l in man_text(sorted(glob.glob(f"/usr/share/man/man1/{page}.1*"))[0]).splitlines()
            if len(l.strip()) > 20
        ]
        r = random.Random(i)

        def one():
            x = r.random()
            return r.choice(common) if x < 0.65 else r.choice(zwj) if x < 0.8 else r.choice(anywhere)

        out = []
        for j, line in enumerate(lines[:300]):
            words = line.split()[: r.randrange(3, 14)]
            k = r.randrange(len(words) + 1)
            words.insert(k, "".join(one() for _ in range(r.choice([1, 1, 1, 2, 3]))))
            if r.random() < 0.4:
                words.append(one())
            out.append(f"[{10 + j // 60:02}:{j % 60:02}] {r.choice(names)}: {' '.join(words)}")
        chats.append((page, "\n".join(out) + "\n"))
    emit("emoji-chat", chats)

if __name__ == "__main__":
    main()
