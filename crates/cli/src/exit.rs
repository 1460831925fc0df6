//! The exit status of every `charon` command, so that a script tells "the
//! server said no" from "my request is wrong" from "a typo in a flag" from
//! "the server is down": see [`EXIT_STATUS_HELP`].

use std::process::ExitCode;

/// The command did what was asked, or the server answered (granted or
/// not: the reply says).
pub const ANSWERED: u8 = 0;
/// A client error: the request, a file, a flag's value, a token or a
/// certificate is wrong; retrying will not help.
pub const CLIENT_ERROR: u8 = 1;
/// The command line cannot be parsed (clap's own status for usage
/// errors).
pub const USAGE: u8 = 2;
/// The server, or what it depends on, cannot be reached or cannot decide
/// now: try again later, or another server.
pub const SERVER_UNAVAILABLE: u8 = 3;

/// The exit statuses as `charon --help` and the man page list them.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  answered: the command did what was asked, or the server answered
     (granted or not: the reply says)
  1  client error: the request, a file, a flag's value, a token or a
     certificate is wrong (unknown resource, refused token, TLS mistake,
     wrong port); retrying will not help
  2  usage: the command line cannot be parsed
  3  server unavailable: the server or its store cannot be reached or
     cannot decide now (connection refused, timed out, UNAVAILABLE); try
     again later or another server
`charon serve` exits 0 after a clean shutdown, 1 when it cannot start and
3 when its store made it stop. Client errors and their classes:
docs/errors.md.";

/// A server-class failure that is not a `charon_client::Error` (a
/// configuration service that cannot be reached, an HTTP 5xx): exit
/// status [`SERVER_UNAVAILABLE`].
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

/// The exit status of a command that failed with `e`: server unavailable
/// if a server-class error is in its chain, a client error otherwise.
pub fn of(e: &anyhow::Error) -> ExitCode {
    let server = e.chain().any(|c| {
        c.is::<Unavailable>()
            || c.downcast_ref::<charon_client::Error>()
                .is_some_and(charon_client::Error::is_server)
    });
    ExitCode::from(if server {
        SERVER_UNAVAILABLE
    } else {
        CLIENT_ERROR
    })
}

/// The exit status of a client's error.
pub fn of_client_error(e: &charon_client::Error) -> ExitCode {
    ExitCode::from(if e.is_server() {
        SERVER_UNAVAILABLE
    } else {
        CLIENT_ERROR
    })
}
