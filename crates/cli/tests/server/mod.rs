//! A `hipdecode serve` process for the tests: started on a port the OS picks, its log kept,
//! and a small HTTP client over it (plain bodies, server-sent event streams, the metrics).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One test at a time: each runs a model on the CPU's two cores.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct ServerProc {
    child: Child,
    pub base: String,
    log: Arc<Mutex<String>>,
    agent: ureq::Agent,
}

/// A client that reads any status as a response.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

impl ServerProc {
    /// Starts `hipdecode serve -m MODEL --port 0 ARGS` and waits until `/health` says ready.
    pub fn start(model: &std::path::Path, args: &[&str]) -> ServerProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hipdecode"))
            .arg("serve")
            .arg("-m")
            .arg(model)
            .args(["--port", "0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hipdecode serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(addr) = line.strip_prefix("listening on ") {
                        let _ = tx.send(addr.to_string());
                    }
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no address printed; log:\n{}", log.lock().unwrap()));
        let server = ServerProc {
            child,
            base,
            log,
            agent: agent(Duration::from_secs(300)),
        };
        let t = Instant::now();
        loop {
            let (status, _) = server.get("/health");
            if status == 200 {
                break;
            }
            assert_eq!(status, 503, "health while loading");
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "never ready:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        self.get_with(path, &[])
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = self.agent.get(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.call() {
            Ok(mut r) => (r.status().as_u16(), read_all(r.body_mut().as_reader())),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    /// POSTs `body` as JSON; the status and the body as text (lossy).
    pub fn post(&self, path: &str, body: &[u8]) -> (u16, String) {
        self.post_with(path, body, &[])
    }

    pub fn post_with(&self, path: &str, body: &[u8], headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = self
            .agent
            .post(self.url(path))
            .header("Content-Type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.send(body) {
            Ok(mut r) => (r.status().as_u16(), read_all(r.body_mut().as_reader())),
            Err(e) => panic!("POST {path}: {e}"),
        }
    }

    /// POSTs a body of `len` bytes the way curl sends a large one: the headers with
    /// `Expect: 100-continue` first, the body only once the server asks for it. Returns the
    /// status and body of the answer, and whether the server asked for the body.
    pub fn post_large(&self, path: &str, len: usize, byte: u8) -> (u16, String, bool) {
        use std::io::Write;
        let addr = self.base.trim_start_matches("http://");
        let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            tcp,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(tcp.try_clone().unwrap());
        let mut status_line = String::new();
        reader.read_line(&mut status_line).expect("a status line");
        let mut asked = false;
        if status_line.contains(" 100 ") {
            asked = true;
            let mut blank = String::new();
            reader.read_line(&mut blank).unwrap();
            let _ = tcp.write_all(&vec![byte; len]);
            status_line.clear();
            reader.read_line(&mut status_line).expect("a status line");
        }
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("status line {status_line:?}"));
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
        let text = String::from_utf8_lossy(&rest).into_owned();
        let body = text
            .split_once("\r\n\r\n")
            .map_or(text.clone(), |(_, b)| b.to_string());
        (status, body, asked)
    }

    /// POSTs `body` and reads the reply as server-sent events.
    pub fn stream(&self, path: &str, body: &serde_json::Value) -> SseStream {
        let r = self
            .agent
            .post(self.url(path))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status().as_u16();
        let reader: Box<dyn Read + Send> = Box::new(r.into_body().into_reader());
        SseStream {
            status,
            lines: BufReader::new(reader),
        }
    }

    /// A metric's value from `/metrics` text: the first sample whose name and labels begin
    /// with `key` (`hipdecode_kv_blocks{state="used"}`).
    pub fn metric(text: &str, key: &str) -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.starts_with(key) && l[key.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    /// Sends SIGTERM and waits for the exit (at most `within`).
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success());
        self.wait(within)
    }

    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                t.elapsed() < within,
                "still running after {within:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_all(mut r: impl Read) -> String {
    let mut bytes = Vec::new();
    let _ = r.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A reply read event by event.
pub struct SseStream {
    pub status: u16,
    lines: BufReader<Box<dyn Read + Send>>,
}

/// One `data:` payload.
#[derive(Debug)]
pub enum SseEvent {
    Json(serde_json::Value),
    Done,
}

impl SseStream {
    /// The next `data:` event; `None` at the end of the body.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let Some(data) = line.trim_end().strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                return Some(SseEvent::Done);
            }
            return Some(SseEvent::Json(
                serde_json::from_str(data).unwrap_or_else(|e| panic!("event {data}: {e}")),
            ));
        }
    }

    /// Every event to the end: the content, the finish reason, the usage, whether an error
    /// event came, and whether `[DONE]` ended it.
    pub fn finish(mut self) -> StreamResult {
        let mut out = StreamResult::default();
        while let Some(e) = self.next_event() {
            match e {
                SseEvent::Done => {
                    out.done = true;
                    break;
                }
                SseEvent::Json(v) => out.take(&v),
            }
        }
        out
    }

    /// Reads until `n` pieces of content came.
    pub fn read_content(&mut self, n: usize) -> StreamResult {
        let mut out = StreamResult::default();
        while out.pieces < n {
            match self.next_event() {
                Some(SseEvent::Json(v)) => out.take(&v),
                _ => break,
            }
        }
        out
    }
}

#[derive(Debug, Default)]
pub struct StreamResult {
    pub text: String,
    pub pieces: usize,
    pub finish_reason: Option<String>,
    pub usage: Option<serde_json::Value>,
    pub error: Option<serde_json::Value>,
    pub done: bool,
}

impl StreamResult {
    fn take(&mut self, v: &serde_json::Value) {
        if v.get("error").is_some() {
            self.error = Some(v.clone());
            return;
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            let piece = c["delta"]["content"].as_str().or(c["text"].as_str());
            if let Some(p) = piece.filter(|p| !p.is_empty()) {
                self.text.push_str(p);
                self.pieces += 1;
            }
            if let Some(f) = c["finish_reason"].as_str() {
                self.finish_reason = Some(f.to_string());
            }
        }
    }
}
