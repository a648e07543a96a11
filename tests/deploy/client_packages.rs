//! The client libraries as users install them: a wheel (`pip wheel`), an npm tarball (`npm pack`)
//! and the Go module (its zip served by a file-based `GOPROXY`, as a module proxy serves it), each
//! built here from a copy of `clients/` and installed into a fresh app in a temporary directory
//! (never imported from the checkout's path), which then asks a real daemon. Also `go vet` on the
//! module, and what each package ships beside its code: `py.typed`, the `.d.ts` types, the ESM
//! and CommonJS entries, an installed package that is a directory (not a link to a checkout).

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice::client::Target;

use crate::clients;
use crate::helpers::{repo_root, spawn_app, Outcome, TestApp};
use crate::tools::{self, example};

fn tcp_url(app: &TestApp) -> String {
    match &app.tcp {
        Target::Tcp(addr) => format!("http://{addr}"),
        Target::Unix(_) => unreachable!("tcp is a TCP target"),
    }
}

/// Runs `command` off the runtime, for as long as a client suite may take (a cold `go vet`, tsc
/// and mypy on a busy machine take more than the helpers' 10 s).
async fn run_long(command: Command) -> Outcome {
    tokio::task::spawn_blocking(move || clients::run_long(command))
        .await
        .expect("join")
}

/// Runs `program args` in `dir`; fails the test with its output unless it exits 0.
async fn ok_in(dir: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut command = example(program, args);
    command.current_dir(dir);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = run_long(command).await;
    assert_eq!(out.code, Some(0), "{program} {args:?} in {dir:?}: {out:?}");
    out
}

/// A copy of `clients/<name>` (sources only) in `into`, so that nothing is built in the checkout.
fn copy_client(name: &str, into: &Path) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("entry");
            let file = entry.file_name();
            let skip = ["node_modules", "__pycache__", "build", "dist"];
            if skip.iter().any(|s| file == *s) || file.to_string_lossy().ends_with(".egg-info") {
                continue;
            }
            let (src, dst) = (entry.path(), to.join(&file));
            if entry.file_type().expect("type").is_dir() {
                copy(&src, &dst);
            } else {
                std::fs::copy(&src, &dst).expect("copy");
            }
        }
    }
    let to = into.join(name);
    copy(&repo_root().join("clients").join(name), &to);
    to
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_wheel_installs_into_a_fresh_app() {
    if !tools::required("python3") {
        return;
    }
    let app = spawn_app().await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let source = copy_client("python", scratch.path());
    let wheels = scratch.path().join("wheels");
    let wheels_arg = wheels.display().to_string();
    let pip = ["-m", "pip", "--disable-pip-version-check", "-q"];
    let build = [
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        &wheels_arg,
        ".",
    ];
    ok_in(&source, "python3", &[&pip[..], &build[..]].concat(), &[]).await;
    let wheel = std::fs::read_dir(&wheels)
        .expect("wheels")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("a wheel was built");
    let site = scratch.path().join("fresh-app/site");
    let (site_arg, wheel_arg) = (site.display().to_string(), wheel.display().to_string());
    let install = [
        "install",
        "--no-deps",
        "--no-index",
        "--target",
        &site_arg,
        &wheel_arg,
    ];
    ok_in(
        scratch.path(),
        "python3",
        &[&pip[..], &install[..]].concat(),
        &[],
    )
    .await;
    assert!(
        site.join("sluice_ratelimit/py.typed").is_file(),
        "py.typed ships"
    );
    // The fresh app: a WSGI app behind SluiceWSGI, called once, from the installed package only.
    let program = r#"
import io, os, sys, sluice_ratelimit
from sluice_ratelimit import CLOSED, Check, Client, SluiceWSGI, TrustedProxies
assert sluice_ratelimit.__file__.startswith(os.environ["SITE"]), sluice_ratelimit.__file__
proxies = TrustedProxies(hops=1)
route = lambda r: Check({"ip": r.client_address(proxies)}, policy="login", on_unreachable=CLOSED)
app = SluiceWSGI(lambda e, s: (s("200 OK", []), [b"welcome"])[1], route, client=Client(url=os.environ["URL"], timeout=5))
seen = {}
body = app({"REQUEST_METHOD": "POST", "PATH_INFO": "/login", "REMOTE_ADDR": "10.0.0.1",
            "HTTP_X_FORWARDED_FOR": "192.0.2.80", "wsgi.input": io.BytesIO()},
           lambda status, headers, exc=None: seen.update(status=status, headers=dict(headers)))
print(seen["status"], seen["headers"].get("x-ratelimit-remaining"), b"".join(body).decode())
"#;
    let url = tcp_url(&app);
    let out = ok_in(
        &scratch.path().join("fresh-app"),
        "python3",
        &["-s", "-c", program],
        &[
            ("PYTHONPATH", &site_arg),
            ("SITE", &site_arg),
            ("URL", &url),
        ],
    )
    .await;
    assert_eq!(out.stdout.trim(), "200 OK 9 welcome", "{out:?}");
    // The hints are read (py.typed): mypy --strict passes a typed use and catches a wrong one.
    if !tools::required_python_module("mypy") {
        return;
    }
    let fresh = scratch.path().join("fresh-app");
    std::fs::write(
        fresh.join("typed.py"),
        "from sluice_ratelimit import Answer, Check, Client, TrustedProxies\n\n\n\
         def ask(client: Client, peer: str) -> int:\n\
         \x20   ip = TrustedProxies([\"10.0.0.0/8\"]).client_address(peer, {})\n\
         \x20   answer: Answer = client.check(Check({\"ip\": ip or \"\"}, policy=\"login\"))\n\
         \x20   return answer.status\n",
    )
    .expect("typed.py");
    std::fs::write(
        fresh.join("wrong.py"),
        "from sluice_ratelimit import Client\n\nClient(timeout=\"soon\").check(42)\n",
    )
    .expect("wrong.py");
    let mypy = |file: &'static str| {
        let mut command = example(
            "python3",
            &["-m", "mypy", "--strict", "--no-incremental", file],
        );
        command.current_dir(&fresh).env("MYPYPATH", &site_arg);
        run_long(command)
    };
    let typed = mypy("typed.py").await;
    assert_eq!(typed.code, Some(0), "{typed:?}");
    let wrong = mypy("wrong.py").await;
    assert_eq!(wrong.code, Some(1), "{wrong:?}");
    assert!(
        wrong
            .stdout
            .contains("Argument \"timeout\" to \"Client\" has incompatible type \"str\""),
        "{wrong:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_tarball_installs_into_a_fresh_app() {
    if !tools::required("node") || !tools::required("npm") {
        return;
    }
    let app = spawn_app().await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let source = copy_client("node", scratch.path());
    let cache = scratch.path().join("npm-cache").display().to_string();
    let npm_env = [
        ("npm_config_cache", cache.as_str()),
        ("npm_config_update_notifier", "false"),
        ("npm_config_fund", "false"),
        ("npm_config_audit", "false"),
    ];
    let packed = ok_in(&source, "npm", &["pack", "--silent"], &npm_env).await;
    let tarball = source.join(
        packed
            .stdout
            .trim()
            .lines()
            .last()
            .expect("npm pack names it"),
    );
    assert!(tarball.is_file(), "{tarball:?}");
    let fresh = scratch.path().join("fresh-app");
    std::fs::create_dir_all(&fresh).expect("mkdir");
    std::fs::write(
        fresh.join("package.json"),
        r#"{"name": "fresh-app", "version": "1.0.0", "private": true}"#,
    )
    .expect("package.json");
    let tarball_arg = tarball.display().to_string();
    ok_in(
        &fresh,
        "npm",
        &["install", "--offline", &tarball_arg],
        &npm_env,
    )
    .await;
    let installed = fresh.join("node_modules/sluice-ratelimit");
    let meta = std::fs::symlink_metadata(&installed).expect("installed");
    assert!(meta.is_dir(), "a directory, not a link to a checkout");
    assert!(installed.join("lib/index.d.ts").is_file(), "types ship");
    let lock = std::fs::read_to_string(fresh.join("package-lock.json")).expect("lock");
    assert!(!lock.contains("\"link\": true"), "{lock}");
    let cjs = r#"
const { Client, trustedProxies } = require('sluice-ratelimit');
if (!require.resolve('sluice-ratelimit').startsWith(process.cwd())) throw new Error(require.resolve('sluice-ratelimit'));
const client = new Client({ url: process.env.URL, timeoutMs: 5000 });
const ip = trustedProxies({ hops: 1 }).clientAddress('10.0.0.1', { 'x-forwarded-for': '192.0.2.81' });
client.check({ policy: 'login', descriptors: { ip } }).then((a) => { console.log(a.status, a.body.remaining); client.close(); });
"#;
    let esm = r#"
import { Client, trustedProxies } from 'sluice-ratelimit';
const client = new Client({ url: process.env.URL, timeoutMs: 5000 });
const ip = trustedProxies({ hops: 1 }).clientAddress('10.0.0.1', { 'x-forwarded-for': '192.0.2.81' });
const answer = await client.check({ policy: 'login', descriptors: { ip } });
console.log(answer.status, answer.body.remaining);
client.close();
"#;
    std::fs::write(fresh.join("app.cjs"), cjs).expect("app.cjs");
    std::fs::write(fresh.join("app.mjs"), esm).expect("app.mjs");
    let url = tcp_url(&app);
    let first = ok_in(&fresh, "node", &["app.cjs"], &[("URL", &url)]).await;
    assert_eq!(first.stdout.trim(), "200 9", "CommonJS: {first:?}");
    let second = ok_in(&fresh, "node", &["app.mjs"], &[("URL", &url)]).await;
    assert_eq!(second.stdout.trim(), "200 8", "ESM: {second:?}");
    type_check(&fresh, &npm_env).await;
}

/// tsc (TypeScript and @types/node installed globally, pinned in .ci/run) checks a typed use of
/// the installed package, CommonJS-style and ESM, and catches a wrong one.
async fn type_check(fresh: &Path, npm_env: &[(&str, &str)]) {
    let root = ok_in(fresh, "npm", &["root", "-g"], npm_env).await;
    let root = PathBuf::from(root.stdout.trim());
    let tsc = root.join("typescript/bin/tsc");
    if !tsc.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "typescript is not installed globally; .ci/run installs it"
        );
        eprintln!("SKIPPED: the type check (npm install -g typescript @types/node)");
        return;
    }
    let config = serde_json::json!({
        "compilerOptions": {
            "strict": true, "noEmit": true, "module": "nodenext", "moduleResolution": "nodenext",
            "target": "es2022", "types": ["node"],
            "typeRoots": [root.join("@types").display().to_string()],
        },
        "files": ["typed.ts", "typed.mts"],
    });
    std::fs::write(fresh.join("tsconfig.json"), config.to_string()).expect("tsconfig");
    let typed = r#"
import { Client, sluice, trustedProxies, clientAddress, CLOSED, withSluice, type Check } from 'sluice-ratelimit';
const client = new Client({ url: 'http://127.0.0.1:7070', timeoutMs: 500 });
const proxies = trustedProxies({ trusted: ['10.0.0.0/8'] });
const middleware = sluice({
  client,
  route: (req): Check | null => (req.url === '/login'
    ? { policy: 'login', descriptors: { ip: clientAddress(req, proxies) ?? '' }, onUnreachable: CLOSED } : null),
  onFallback: (check, error) => console.log(check.policy, error.message),
  onDenied: (_check, answer) => ({ status: 429, headers: { 'retry-after': answer.headers['retry-after'] ?? '1' }, body: '' }),
});
export const count: number = middleware.watch.count;
export const handler = withSluice(async () => new Response('ok'), { route: () => null });
"#;
    std::fs::write(fresh.join("typed.ts"), typed).expect("typed.ts");
    let esm = "import { Client } from 'sluice-ratelimit';\nexport const n: number = new Client().timeoutMs;\n";
    std::fs::write(fresh.join("typed.mts"), esm).expect("typed.mts");
    let tsc_arg = tsc.display().to_string();
    ok_in(fresh, "node", &[&tsc_arg, "-p", "."], &[]).await;
    let wrong = "import { Client } from 'sluice-ratelimit';\nnew Client({ timeoutMs: 'soon' });\n";
    std::fs::write(fresh.join("typed.mts"), wrong).expect("typed.mts");
    let mut command = example("node", &[&tsc_arg, "-p", "."]);
    command.current_dir(fresh);
    let out = run_long(command).await;
    assert_eq!(out.code, Some(2), "a wrong use is a type error: {out:?}");
    assert!(out.stdout.contains("TS2322"), "{out:?}");
}

/// Module zip, .mod and .info of `clients/go` as v0.1.0 under `proxy`, in a module proxy's layout.
async fn go_proxy(source: &Path, proxy: &Path) {
    let module = "github.com/sluice-rs/sluice/clients/go";
    let at = proxy.join(module).join("@v");
    std::fs::create_dir_all(&at).expect("mkdir");
    std::fs::copy(source.join("go.mod"), at.join("v0.1.0.mod")).expect("mod");
    std::fs::write(at.join("v0.1.0.info"), r#"{"Version":"v0.1.0"}"#).expect("info");
    std::fs::write(at.join("list"), "v0.1.0\n").expect("list");
    // A module zip: every file under `<module>@<version>/` (Python's zipfile, on PATH for CI).
    let script = "import os, sys, zipfile\n\
        src, out, prefix = sys.argv[1:]\n\
        with zipfile.ZipFile(out, 'w') as z:\n\
        \x20   for root, _, files in os.walk(src):\n\
        \x20       for f in sorted(files):\n\
        \x20           path = os.path.join(root, f)\n\
        \x20           z.write(path, prefix + '/' + os.path.relpath(path, src))\n";
    let zip = at.join("v0.1.0.zip").display().to_string();
    let prefix = format!("{module}@v0.1.0");
    let src = source.display().to_string();
    ok_in(proxy, "python3", &["-c", script, &src, &zip, &prefix], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_module_installs_into_a_fresh_app() {
    if !tools::required("go") || !tools::required("python3") {
        return;
    }
    let app = spawn_app().await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let gopath = scratch.path().join("gopath").display().to_string();
    let gocache = scratch.path().join("gocache").display().to_string();
    let proxy = scratch.path().join("proxy");
    let proxy_url = format!("file://{}", proxy.display());
    // -modcacherw: the module cache in `scratch` can be removed with it.
    let env = |goproxy| {
        [
            ("GOTOOLCHAIN", "local"),
            ("GOFLAGS", "-mod=mod -modcacherw"),
            ("GOSUMDB", "off"),
            ("GOPATH", gopath.as_str()),
            ("GOCACHE", gocache.as_str()),
            ("GOPROXY", goproxy),
        ]
    };
    let source = copy_client("go", scratch.path());
    ok_in(&source, "go", &["vet", "./..."], &env("off")).await;
    std::fs::create_dir_all(&proxy).expect("mkdir");
    go_proxy(&source, &proxy).await;
    let fresh = scratch.path().join("fresh-app");
    std::fs::create_dir_all(&fresh).expect("mkdir");
    std::fs::write(
        fresh.join("go.mod"),
        "module example.com/fresh\n\ngo 1.19\n\nrequire github.com/sluice-rs/sluice/clients/go v0.1.0\n",
    )
    .expect("go.mod");
    let main = r#"package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"

	"github.com/sluice-rs/sluice/clients/go/sluice"
)

func main() {
	client, err := sluice.NewClient(sluice.Options{URL: os.Getenv("URL")})
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest("POST", "/login", nil)
	r.RemoteAddr = "10.0.0.1:4711"
	r.Header.Set("X-Forwarded-For", "192.0.2.82")
	ip := sluice.ClientIP(r, sluice.TrustedProxies{Hops: 1})
	answer, err := client.Check(context.Background(), sluice.Check{Policy: "login", Descriptors: map[string]string{"ip": ip}})
	if err != nil {
		panic(err)
	}
	fmt.Println(answer.Status, *answer.Result.Remaining)
}
"#;
    std::fs::write(fresh.join("main.go"), main).expect("main.go");
    let binary = scratch.path().join("fresh").display().to_string();
    ok_in(
        &fresh,
        "go",
        &["build", "-o", &binary, "."],
        &env(&proxy_url),
    )
    .await;
    let url = tcp_url(&app);
    let out = ok_in(&fresh, &binary, &[], &[("URL", &url)]).await;
    assert_eq!(out.stdout.trim(), "200 9", "{out:?}");
    let sum = std::fs::read_to_string(fresh.join("go.sum")).expect("go.sum");
    assert!(
        sum.contains("github.com/sluice-rs/sluice/clients/go v0.1.0 h1:"),
        "{sum}"
    );
}
