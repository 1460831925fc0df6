//! The test kit itself works: private instances start and stop.

use std::io::{Read, Write};
use std::net::TcpStream;

#[test]
fn a_private_redis_answers_ping() {
    let redis = charon_testkit::RedisServer::start();
    let mut s = TcpStream::connect(("127.0.0.1", redis.port())).expect("connect");
    s.write_all(b"PING\r\n").expect("write");
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"+PONG\r\n");
}

#[test]
fn a_private_postgres_accepts_connections() {
    let pg = charon_testkit::Postgres::start();
    let url = pg.create_database("charon_test");
    assert!(url.ends_with("/charon_test"));
}
