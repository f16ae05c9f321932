//! Private PostgreSQL and RabbitMQ servers for fault and TLS tests: each one
//! in a temporary directory of its own, on free ports, started, stopped and
//! restarted by the test that owns it, and removed when dropped. The
//! machine's shared servers (5432, 5672) are never touched. [`TestCerts`]
//! makes a CA and a server certificate it signed (with the `openssl`
//! command line) for the servers' TLS variants.
//!
//! Include it with `#[path = "common/private.rs"] mod private;` beside
//! `mod common;`, whose [`free_port`] it uses.

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::free_port;

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "toolfleet-{name}-{}",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

fn said(output: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The last `max` bytes of a file, for failure messages.
fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

/// Runs `openssl <args>` in `dir`, failing the test if it cannot.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run openssl ({e}); it makes the test certificates: install it \
                 (these tests never skip)"
            )
        });
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        said(&output)
    );
}

/// A CA, a server certificate it signed for `localhost` and 127.0.0.1 (and
/// nothing else), the server's key, and a second CA that signed nothing,
/// all PEM files in a temporary directory removed when dropped.
pub(crate) struct TestCerts {
    dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub other_ca: PathBuf,
}

impl TestCerts {
    /// ECDSA P-256 keys, valid for two days.
    pub(crate) fn generate() -> TestCerts {
        let dir = fresh_dir("certs");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        for (name, subject) in [("ca", "toolfleet test CA"), ("other-ca", "another test CA")] {
            let (key, cert) = (format!("{name}.key"), format!("{name}.pem"));
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &cert, "-days", "2"]);
            let subject = format!("/CN={subject}");
            args.extend(["-subj", &subject]);
            args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
            args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
            openssl(&dir, &args);
        }
        let mut args = vec!["req"];
        args.extend(ec);
        args.extend(["-keyout", "server.key", "-out", "server.csr"]);
        args.extend(["-subj", "/CN=localhost"]);
        openssl(&dir, &args);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName = DNS:localhost, IP:127.0.0.1\n\
             basicConstraints = critical, CA:FALSE\n\
             keyUsage = critical, digitalSignature\n\
             extendedKeyUsage = serverAuth\n",
        )
        .expect("extensions written");
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                "0x2a",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.pem",
            ],
        );
        TestCerts {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            other_ca: dir.join("other-ca.pem"),
            dir,
        }
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PostgreSQL cluster of this test alone: `initdb` into a temporary
/// directory (as the `postgres` OS user when the test runs as root, since
/// initdb refuses root), served on a free port with trust authentication.
pub(crate) struct PrivatePostgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// The directory of `initdb` and `pg_ctl`: `TOOLFLEET_TEST_PG_BIN`, else
    /// the newest `/usr/lib/postgresql/<version>/bin`.
    fn bin() -> PathBuf {
        if let Some(dir) = std::env::var_os("TOOLFLEET_TEST_PG_BIN") {
            return PathBuf::from(dir);
        }
        let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                let bin = e.path().join("bin");
                bin.join("initdb").exists().then_some((version, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, bin)| bin).expect(
            "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin; \
             install them or set TOOLFLEET_TEST_PG_BIN (these tests never skip)",
        )
    }

    /// Creates a cluster and starts it.
    pub(crate) fn start() -> PrivatePostgres {
        PrivatePostgres::started(PrivatePostgres::init)
    }

    /// A cluster `make` creates, started, on a new port while its port was
    /// taken (see [`on_free_ports`]).
    fn started(make: impl Fn() -> PrivatePostgres) -> PrivatePostgres {
        on_free_ports("PostgreSQL", "Address already in use", || {
            let pg = make();
            pg.launch().map(|()| pg)
        })
    }

    /// Creates a cluster that speaks TLS with `certs`' server certificate
    /// and refuses every TCP connection without it (`hostssl` lines only:
    /// trust, but a password over SCRAM for role `tf_scram`), and starts it.
    pub(crate) fn start_tls(certs: &TestCerts) -> PrivatePostgres {
        PrivatePostgres::started(|| PrivatePostgres::init_tls(certs))
    }

    /// A cluster configured for TLS as [`PrivatePostgres::start_tls`] says,
    /// not yet started.
    fn init_tls(certs: &TestCerts) -> PrivatePostgres {
        let pg = PrivatePostgres::init();
        let (cert, key) = (pg.dir.join("server.crt"), pg.dir.join("server.key"));
        std::fs::copy(&certs.cert, &cert).expect("certificate copied");
        std::fs::copy(&certs.key, &key).expect("key copied");
        // PostgreSQL reads a key only its own user may read.
        let chmod = Command::new("chmod").arg("600").arg(&key).output();
        assert!(chmod.expect("chmod runs").status.success());
        if pg.as_postgres {
            let chown = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&cert)
                .arg(&key)
                .output()
                .expect("chown runs");
            assert!(chown.status.success(), "chown: {}", said(&chown));
        }
        let conf = pg.data().join("postgresql.conf");
        let mut settings = std::fs::read_to_string(&conf).expect("postgresql.conf");
        settings.push_str(&format!(
            "\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            cert.display(),
            key.display()
        ));
        std::fs::write(&conf, settings).expect("postgresql.conf written");
        std::fs::write(
            pg.data().join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all tf_scram 127.0.0.1/32 scram-sha-256\n\
             hostssl all all 127.0.0.1/32 trust\n",
        )
        .expect("pg_hba.conf written");
        pg
    }

    /// Creates a cluster, not yet started.
    fn init() -> PrivatePostgres {
        let dir = fresh_dir("pg");
        let as_postgres = is_root();
        let pg = PrivatePostgres {
            bin: Self::bin(),
            port: free_port(),
            as_postgres,
            dir,
        };
        if as_postgres {
            let chown = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&pg.dir)
                .output()
                .expect("chown runs");
            assert!(chown.status.success(), "chown: {}", said(&chown));
        }
        let data = pg.data();
        let initdb = pg
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .args(["--no-locale", "-E", "UTF8"])
            .output()
            .expect("initdb runs");
        assert!(initdb.status.success(), "initdb: {}", said(&initdb));
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        command.stdin(Stdio::null()).current_dir(&self.dir);
        command
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Starts the (stopped) server on its port and waits until it accepts
    /// connections.
    pub(crate) fn start_again(&self) {
        if let Err(why) = self.launch() {
            panic!("{why}");
        }
    }

    /// Starts the server and waits until it accepts connections; why not
    /// when `pg_ctl` failed (with the server's log).
    fn launch(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let started = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.log_file())
            .args(["-o", &options, "-w", "-t", "60", "start"])
            .output()
            .expect("pg_ctl runs");
        if started.status.success() {
            Ok(())
        } else {
            Err(format!("pg_ctl start: {}\n{}", said(&started), self.log()))
        }
    }

    /// Stops the server (fast: sessions are disconnected) and waits.
    pub(crate) fn stop(&self) {
        let stopped = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w", "-t", "60", "stop"])
            .output()
            .expect("pg_ctl runs");
        assert!(
            stopped.status.success(),
            "pg_ctl stop: {}\n{}",
            said(&stopped),
            self.log()
        );
        assert!(!listening(self.port), "PostgreSQL still listens after stop");
    }

    pub(crate) fn restart(&self) {
        self.stop();
        self.start_again();
    }

    /// The end of the server's log.
    pub(crate) fn log(&self) -> String {
        format!("--- PostgreSQL log ---\n{}", tail(&self.log_file(), 8_000))
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log());
        }
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A RabbitMQ node of this test alone, `tf-<id>@localhost`: its own
/// database, logs, cookie (`HOME` is its directory), configuration (one AMQP
/// listener on a free port, no plugins, so no management port) and
/// distribution port. It runs as a child process of the test.
pub(crate) struct PrivateRabbit {
    dir: PathBuf,
    node: String,
    port: u16,
    /// The TLS listener's port, on 127.0.0.1 and 127.0.0.2 (a loopback
    /// address the test certificate does not name), if any.
    tls_port: Option<u16>,
    dist_port: u16,
    child: Option<Child>,
    starts: u32,
}

/// The RabbitMQ scripts: `TOOLFLEET_TEST_RABBITMQ_BIN`, else the package's
/// own directory (not the `/usr/sbin` wrappers, which switch to the
/// `rabbitmq` user and its shared cookie and configuration).
fn rabbit_script(name: &str) -> PathBuf {
    let dir = std::env::var_os("TOOLFLEET_TEST_RABBITMQ_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/rabbitmq/bin"));
    let path = dir.join(name);
    assert!(
        path.exists(),
        "no {} (RabbitMQ's scripts); install rabbitmq-server or set \
         TOOLFLEET_TEST_RABBITMQ_BIN (these tests never skip)",
        path.display()
    );
    path
}

impl PrivateRabbit {
    /// Starts a fresh node and waits until its AMQP port listens.
    pub(crate) fn start() -> PrivateRabbit {
        PrivateRabbit::start_with(None)
    }

    /// Starts a fresh node that also listens for AMQP over TLS with
    /// `certs`' server certificate, and waits until both ports listen.
    pub(crate) fn start_tls(certs: &TestCerts) -> PrivateRabbit {
        PrivateRabbit::start_with(Some(certs))
    }

    /// A fresh node on free ports, started, on new ports while one of its
    /// ports was taken (see [`on_free_ports`]).
    fn start_with(certs: Option<&TestCerts>) -> PrivateRabbit {
        on_free_ports("RabbitMQ", "eaddrinuse", || {
            let mut rabbit = PrivateRabbit::configured(certs);
            rabbit.launch().map(|()| rabbit)
        })
    }

    /// A node's directory and configuration, on free ports, not started.
    fn configured(certs: Option<&TestCerts>) -> PrivateRabbit {
        let dir = fresh_dir("rabbit");
        let id = uuid::Uuid::now_v7().simple().to_string();
        let rabbit = PrivateRabbit {
            node: format!("tf-{}@localhost", &id[id.len() - 12..]),
            port: free_port(),
            tls_port: certs.map(|_| free_port()),
            dist_port: free_port(),
            dir,
            child: None,
            starts: 0,
        };
        let mut config = format!(
            "listeners.tcp.default = 127.0.0.1:{}\nloopback_users.guest = true\n",
            rabbit.port
        );
        if let (Some(certs), Some(port)) = (certs, rabbit.tls_port) {
            config.push_str(&format!(
                "listeners.ssl.default = 127.0.0.1:{port}\n\
                 listeners.ssl.unnamed = 127.0.0.2:{port}\n\
                 ssl_options.cacertfile = {}\n\
                 ssl_options.certfile = {}\n\
                 ssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_none\n\
                 ssl_options.fail_if_no_peer_cert = false\n",
                certs.ca.display(),
                certs.cert.display(),
                certs.key.display()
            ));
        }
        std::fs::write(rabbit.dir.join("rabbitmq.conf"), config).expect("config written");
        std::fs::write(rabbit.dir.join("enabled_plugins"), "[].\n").expect("plugins written");
        // Not /etc/rabbitmq/rabbitmq-env.conf, which names the shared node.
        std::fs::write(rabbit.dir.join("rabbitmq-env.conf"), "").expect("env written");
        rabbit
    }

    fn env(&self, command: &mut Command) {
        let d = &self.dir;
        command
            .env("HOME", d)
            .env("RABBITMQ_CONF_ENV_FILE", d.join("rabbitmq-env.conf"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env_remove("RABBITMQ_NODENAME")
            .env_remove("RABBITMQ_DIST_PORT")
            .current_dir(d);
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub(crate) fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// `amqps://guest:guest@<host>:<TLS port>/%2f` (a node started with
    /// [`PrivateRabbit::start_tls`]).
    pub(crate) fn tls_url(&self, host: &str) -> String {
        let port = self.tls_port.expect("a node started with start_tls");
        format!("amqps://guest:guest@{host}:{port}/%2f")
    }

    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// Starts the (stopped) node on its port, with the data it had.
    pub(crate) fn start_again(&mut self) {
        if let Err(why) = self.launch() {
            panic!("{why}");
        }
    }

    /// Starts the node and waits until it listens; why not when its
    /// process exited first (with its console and log).
    fn launch(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "the node is already running");
        self.starts += 1;
        let out = std::fs::File::create(self.dir.join(format!("console-{}.log", self.starts)))
            .expect("console log");
        let d = &self.dir;
        let mut command = Command::new(rabbit_script("rabbitmq-server"));
        self.env(&mut command);
        command
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("rabbitmq.pid"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out);
        let child = command.spawn().expect("rabbitmq-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(90);
        let ports = [Some(self.port), self.tls_port];
        while !ports.into_iter().flatten().all(listening) {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "rabbitmq-server exited with {status} before listening\n{}",
                    self.log()
                ));
            }
            assert!(
                Instant::now() < deadline,
                "RabbitMQ did not listen within 90 s\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Stops the node as an operator would (SIGTERM: RabbitMQ shuts down
    /// cleanly, closing every connection) and waits for it to exit.
    pub(crate) fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal(child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                self.kill_beam();
                let _ = child.kill();
                let _ = child.wait();
                panic!("RabbitMQ did not stop within 60 s\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!listening(self.port), "RabbitMQ still listens after stop");
    }

    pub(crate) fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the Erlang VM itself (its pid is in the pid file).
    fn kill_beam(&self) {
        let pid = std::fs::read_to_string(self.dir.join("rabbitmq.pid")).unwrap_or_default();
        if let Ok(pid) = pid.trim().parse::<u32>() {
            signal(pid, "KILL");
        }
    }

    /// Runs `rabbitmqctl -n <node> <args>` against this node.
    pub(crate) fn ctl(&self, args: &[&str]) -> Output {
        let mut command = Command::new(rabbit_script("rabbitmqctl"));
        self.env(&mut command);
        command
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("rabbitmqctl runs")
    }

    /// The node's console output and the end of its log.
    pub(crate) fn log(&self) -> String {
        let mut text = String::new();
        for n in 1..=self.starts {
            let file = self.dir.join(format!("console-{n}.log"));
            text.push_str(&format!(
                "--- RabbitMQ console, start {n} ---\n{}\n",
                tail(&file, 4_000)
            ));
        }
        let log = self.dir.join("log").join(format!("{}.log", self.node));
        text.push_str(&format!("--- RabbitMQ log ---\n{}", tail(&log, 8_000)));
        text
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log());
        }
        if let Some(mut child) = self.child.take() {
            signal(child.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(30);
            while !matches!(child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !matches!(child.try_wait(), Ok(Some(_))) {
                self.kill_beam();
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private server that `start` makes on ports found free and starts
/// (or says why it did not). A port found free may be taken before the
/// server binds it (another test's server, or an outgoing connection's
/// ephemeral port): when why it did not start says `in_use`, a new server
/// on new ports is tried, three times at most; any other failure, or a
/// third taken port, fails the test with why.
fn on_free_ports<T>(what: &str, in_use: &str, start: impl Fn() -> Result<T, String>) -> T {
    let mut tries = 0;
    loop {
        tries += 1;
        match start() {
            Ok(server) => return server,
            Err(why) if tries < 3 && why.contains(in_use) => {
                eprintln!("a private {what}'s port was taken; trying new ones");
            }
            Err(why) => panic!("{why}"),
        }
    }
}

/// Sends `SIGname` to process `pid`.
pub(crate) fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
