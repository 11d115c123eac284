use super::*;
use crate::http::answer::{chunked_end, dechunk, ChunkError};

#[test]
fn targets_carry_host_port_path_and_credentials() {
    let t = Target::parse("https://us%40er:p%3Ass@[::1]:8443/a/b?c=d").unwrap();
    assert_eq!(
        t.origin,
        Origin {
            tls: true,
            host: "::1".into(),
            port: 8443,
            client: None,
        }
    );
    assert_eq!(t.authority, "[::1]:8443");
    assert_eq!(t.path, "/a/b?c=d");
    use base64::Engine;
    let expected = base64::engine::general_purpose::STANDARD.encode("us@er:p:ss");
    assert_eq!(t.authorization, Some(format!("Basic {expected}")));
    let t = Target::parse("http://example.com").unwrap();
    assert_eq!(
        (t.origin.port, t.authority.as_str(), t.path.as_str()),
        (80, "example.com", "/")
    );
    assert!(t.authorization.is_none());
    assert!(Target::parse("ftp://example.com/x").is_err());
    assert!(Target::parse("not a url").is_err());
}

/// A receiver that answers the requests on each connection with the
/// next scripted answer (written `chunk` bytes at a time; `|pause|`
/// waits 50 ms; `|close|` closes without answering), and counts
/// connections and requests.
async fn receiver(
    answers: Vec<&'static str>,
    chunk: usize,
) -> (
    String,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook?x=1", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(answers);
    let (c, r) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            c.fetch_add(1, Ordering::SeqCst);
            let (r, answers) = (r.clone(), answers.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: the head, then content-length bytes.
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut b = [0u8; 1024];
                        match s.read(&mut b).await {
                            Ok(n) if n > 0 => buf.extend_from_slice(&b[..n]),
                            _ => return,
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                    assert!(head.starts_with("post /hook?x=1 http/1.1\r\n"), "{head}");
                    assert!(head.contains("\r\nwebhook-id: msg_1\r\n"), "{head}");
                    let length: usize = head
                        .split("\r\n")
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .unwrap()
                        .parse()
                        .unwrap();
                    while buf.len() < head_end + length {
                        let mut b = [0u8; 1024];
                        let n = s.read(&mut b).await.unwrap();
                        buf.extend_from_slice(&b[..n]);
                    }
                    assert_eq!(&buf[head_end..head_end + length], b"{\"a\":1}");
                    buf.drain(..head_end + length);
                    let i = r.fetch_add(1, Ordering::SeqCst);
                    let answer = answers[i.min(answers.len() - 1)];
                    if answer == "|close|" {
                        return;
                    }
                    for (i, piece) in answer.split("|pause|").enumerate() {
                        if i > 0 {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        for part in piece.as_bytes().chunks(chunk) {
                            // A client that kept what it wanted of a long
                            // answer may close before the rest is written.
                            if s.write_all(part).await.is_err() || s.flush().await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (url, connections, requests)
}

fn client() -> HttpClient {
    HttpClient::new(
        Duration::from_secs(5),
        Duration::from_secs(5),
        vec![Cidr::parse("127.0.0.0/8").unwrap()],
    )
    .unwrap()
}

async fn post(client: &HttpClient, url: &str) -> Result<Answer, Failure> {
    client
        .post(url, None, &[("webhook-id", "msg_1".into())], b"{\"a\":1}")
        .await
}

/// Posts `posts` times through one client to a [`receiver`] of
/// `answers`, waiting `gap` between posts: the statuses, then how many
/// connections and requests the receiver saw.
async fn statuses(
    answers: Vec<&'static str>,
    posts: usize,
    gap: Duration,
) -> (Vec<u16>, usize, usize) {
    use std::sync::atomic::Ordering;
    let (url, connections, requests) = receiver(answers, 1024).await;
    let client = client();
    let mut seen = Vec::new();
    for _ in 0..posts {
        seen.push(post(&client, &url).await.unwrap().status);
        tokio::time::sleep(gap).await;
    }
    (
        seen,
        connections.load(Ordering::SeqCst),
        requests.load(Ordering::SeqCst),
    )
}

#[tokio::test]
async fn answers_of_known_length_keep_the_connection() {
    let (seen, connections, requests) = statuses(
        vec!["HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"],
        3,
        Duration::ZERO,
    )
    .await;
    assert_eq!(seen, [200, 200, 200]);
    assert_eq!(requests, 3);
    assert_eq!(connections, 1, "one connection, reused");
}

#[tokio::test]
async fn idle_connections_are_bounded_in_all_the_longest_idle_closed_first() {
    let mut client = client();
    client.idle_total = 2;
    let mut urls = Vec::new();
    for _ in 0..3 {
        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        let (url, _, _) = receiver(vec![answer], 1024).await;
        assert_eq!(post(&client, &url).await.unwrap().status, 200);
        urls.push(url);
    }
    let idle = client.idle.lock().unwrap();
    assert_eq!(idle.total, 2);
    let kept: usize = idle.by_origin.values().map(Vec::len).sum();
    assert_eq!(kept, 2, "three origins, two kept");
    let first = Target::parse(&urls[0]).unwrap().origin;
    assert!(
        !idle.by_origin.contains_key(&first),
        "the longest idle went"
    );
}

#[tokio::test]
async fn an_answer_with_eighty_headers_is_an_answer() {
    let mut answer = String::from("HTTP/1.1 200 OK\r\n");
    for i in 0..80 {
        answer.push_str(&format!("x-h{i}: {i}\r\n"));
    }
    answer.push_str("content-length: 0\r\n\r\n");
    let answer: &'static str = Box::leak(answer.into_boxed_str());
    let (seen, connections, _) = statuses(vec![answer], 2, Duration::ZERO).await;
    assert_eq!(seen, [200, 200]);
    assert_eq!(connections, 1);
}

#[tokio::test]
async fn heads_past_the_header_count_or_the_size_limit_fail_the_request() {
    let mut many = String::from("HTTP/1.1 200 OK\r\n");
    for i in 0..=MAX_HEADERS {
        many.push_str(&format!("x{i}: y\r\n"));
    }
    many.push_str("content-length: 0\r\n\r\n");
    let big = format!(
        "HTTP/1.1 200 OK\r\nx-pad: {}\r\ncontent-length: 0\r\n\r\n",
        "a".repeat(HEAD_LIMIT)
    );
    for answer in [many, big] {
        let answer: &'static str = Box::leak(answer.into_boxed_str());
        let (url, _, _) = receiver(vec![answer], 64 * 1024).await;
        let got = post(&client(), &url).await;
        assert!(matches!(got, Err(Failure::Failed(_))), "{}", &answer[..40]);
    }
}

#[tokio::test]
async fn a_promised_body_that_never_comes_costs_the_connection_not_the_timeout() {
    let (url, connections, _) = receiver(
        vec!["HTTP/1.1 200 OK\r\ncontent-length: 65536\r\n\r\n"],
        1024,
    )
    .await;
    let client = HttpClient::new(
        Duration::from_secs(30),
        Duration::from_secs(5),
        vec![Cidr::parse("127.0.0.0/8").unwrap()],
    )
    .unwrap();
    let started = Instant::now();
    assert_eq!(post(&client, &url).await.unwrap().status, 200);
    // Bounded by DRAIN_FOR, far inside the 30 s request timeout.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(post(&client, &url).await.unwrap().status, 200);
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the half-read connection is dropped"
    );
}

#[tokio::test]
async fn two_different_lengths_fail_the_request() {
    let (url, _, _) = receiver(
        vec!["HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc"],
        1024,
    )
    .await;
    assert!(matches!(
        post(&client(), &url).await,
        Err(Failure::Failed(_))
    ));
    let (url, _, _) = receiver(
        vec!["HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc"],
        1024,
    )
    .await;
    assert_eq!(
        post(&client(), &url).await.unwrap().status,
        200,
        "equal lengths are one"
    );
}

#[tokio::test]
async fn heads_read_in_pieces_after_an_informational_answer_are_parsed() {
    let (url, _, _) = receiver(
        vec!["HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n"],
        3,
    )
    .await;
    let a = post(&client(), &url).await.unwrap();
    assert_eq!(
        a,
        Answer {
            status: 503,
            retry_after: Some("7".into()),
            body: Vec::new(),
        }
    );
}

/// The start of each answer's body is kept, up to the limit, whatever
/// its framing: a length, chunks (de-chunked), or the connection's end
/// (what came before the drain's time ran out); with no limit, none.
#[tokio::test]
async fn answer_bodies_are_kept_up_to_the_limit() {
    let (url, _, _) = receiver(
        vec![
            "HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n",
            "HTTP/1.1 500 Oops\r\ncontent-length: 4\r\n\r\nbusy",
            "HTTP/1.0 200 OK\r\n\r\nbye",
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
            "HTTP/1.1 200 OK\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        ],
        3,
    )
    .await;
    let keeping = client().keeping_bodies(8);
    let mut kept = Vec::new();
    for _ in 0..6 {
        let a = post(&keeping, &url).await.unwrap();
        kept.push((a.status, String::from_utf8(a.body).unwrap()));
    }
    assert_eq!(
        kept,
        [
            (200, "hello wo".to_string()),
            (200, "helloabc".to_string()),
            (500, "busy".to_string()),
            (200, "bye".to_string()),
            (200, "ok".to_string()),
            (200, "hi".to_string()),
        ]
    );
    let (url, _, _) = receiver(vec!["HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"], 5).await;
    assert_eq!(post(&client(), &url).await.unwrap().body, b"");
    assert_eq!(
        dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n", 4),
        (b"abcd".to_vec(), false)
    );
}

/// `dechunk` reads a body for its start: the data of a chunk still coming
/// counts, any chunk size is taken, and it asks for more only while the
/// framing holds and fewer than `keep` bytes came.
#[test]
fn dechunk_keeps_the_start_and_says_whether_more_is_wanted() {
    let cases: [(&[u8], usize, &[u8], bool); 8] = [
        (b"5\r\nhel", 8, b"hel", true),
        (b"5\r\nhel", 3, b"hel", false),
        (b"5\r\nhello\r", 8, b"hello", true),
        (b"5\r\nhello\r\n0\r\n\r\n", 8, b"hello", false),
        (b"5\r\nhello\r\nzz\r\nabc", 8, b"hello", false),
        (b"186a0\r\nabc", 8, b"abc", true),
        (b"ffffffffffffffff\r\nabc", 8, b"abc", true),
        (b"5\r\nhello\r\n", 0, b"", false),
    ];
    for (raw, keep, data, more) in cases {
        assert_eq!(
            dechunk(raw, keep),
            (data.to_vec(), more),
            "{}",
            String::from_utf8_lossy(raw)
        );
    }
}

/// `len` bytes of printable ASCII in a period of 89 (a prime, so a kept
/// body that starts or ends at the wrong place does not compare equal).
fn printable(len: usize) -> String {
    (0..len)
        .map(|i| char::from(b'!' + u8::try_from(i % 89).unwrap()))
        .collect()
}

/// `text` as a chunked answer in chunks of `size` bytes.
fn chunked_answer(text: &str, size: usize) -> String {
    let mut answer = String::from("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
    for piece in text.as_bytes().chunks(size) {
        answer.push_str(&format!("{:x}\r\n", piece.len()));
        answer.push_str(std::str::from_utf8(piece).unwrap());
        answer.push_str("\r\n");
    }
    answer + "0\r\n\r\n"
}

/// Bodies longer than what is read to keep a connection still keep their
/// first bytes, up to the most kept: 100 KB by its length, 256 KiB in
/// 8 KiB chunks (past the chunk buffer), and 256 KiB whose first chunk is
/// larger than the buffer; the connections are not kept.
#[tokio::test]
async fn the_start_of_a_body_past_the_drain_limits_is_kept() {
    use std::sync::atomic::Ordering;
    let text = printable(256 * 1024);
    let answers: Vec<&'static str> = [
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n{}",
            &text[..100_000]
        ),
        chunked_answer(&text, 8 * 1024),
        chunked_answer(&text, 100_000),
    ]
    .into_iter()
    .map(|a| &*Box::leak(a.into_boxed_str()))
    .collect();
    // Each answer twice: once for each limit.
    let (url, connections, _) = receiver([&answers[..], &answers[..]].concat(), 64 * 1024).await;
    for keep in [MAX_KEPT_BODY, 4096] {
        let client = client().keeping_bodies(keep);
        for i in 0..3 {
            let a = post(&client, &url).await.unwrap();
            assert_eq!(a.status, 200);
            assert!(
                a.body == text.as_bytes()[..keep],
                "answer {i} keeping {keep}: {} bytes kept",
                a.body.len()
            );
        }
    }
    assert_eq!(connections.load(Ordering::SeqCst), 6, "none is reused");
}

#[tokio::test]
async fn chunked_answers_keep_the_connection_closing_ones_drop_it() {
    let (seen, connections, _) = statuses(
        vec![
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\n",
            "HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.0 202 Accepted\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 203 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        ],
        5,
        Duration::ZERO,
    )
    .await;
    assert_eq!(seen, [200, 201, 202, 203, 200]);
    // The chunked answer's connection carried the 201, which closed it;
    // the HTTP/1.0 and the gzip-coded answers closed theirs.
    assert_eq!(connections, 4);
}

#[tokio::test]
async fn a_chunked_body_read_in_single_bytes_keeps_the_connection_bad_framing_drops_it() {
    use std::sync::atomic::Ordering;
    let good = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let (url, connections, _) = receiver(vec![good], 1).await;
    let client = client();
    for _ in 0..3 {
        assert_eq!(post(&client, &url).await.unwrap().status, 200);
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    let bad = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n";
    let (url, connections, _) = receiver(vec![bad], 1024).await;
    for _ in 0..2 {
        assert_eq!(
            post(&client, &url).await.unwrap().status,
            200,
            "the head counts"
        );
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        2,
        "bad framing drops it"
    );
}

#[tokio::test]
async fn an_early_answer_to_a_request_still_being_written_is_read() {
    // The receiver answers 413 after the head, stops reading and closes
    // while the client is still writing a body far larger than the
    // socket buffers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            head.extend_from_slice(&buf[..n]);
        }
        s.write_all(
            b"HTTP/1.1 413 Payload Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    let body = vec![b'x'; 16 * 1024 * 1024];
    let answer = client()
        .post(&url, None, &[("webhook-id", "msg_1".into())], &body)
        .await;
    assert_eq!(answer.unwrap().status, 413);
}

#[test]
fn chunked_end_finds_the_end_of_a_body_and_refuses_bad_framing() {
    let body = b"4\r\nWiki\r\n5 ; a=b\r\npedia\r\n0\r\nt: 1\r\n\r\n";
    assert_eq!(chunked_end(body), Ok(Some(body.len())));
    for cut in 0..body.len() {
        assert_eq!(chunked_end(&body[..cut]), Ok(None), "cut at {cut}");
    }
    assert_eq!(chunked_end(b"0\r\n\r\nextra"), Ok(Some(5)));
    assert_eq!(chunked_end(b"x\r\n"), Err(ChunkError));
    assert_eq!(chunked_end(b"\r\n"), Err(ChunkError));
    assert_eq!(chunked_end(b"3\r\nabcd\r\n"), Err(ChunkError));
    assert_eq!(chunked_end(b"fffffffff\r\n"), Err(ChunkError));
    assert_eq!(
        chunked_end(b"ffffff\r\n"),
        Err(ChunkError),
        "over the limit"
    );
}

proptest::proptest! {
    #[test]
    fn answer_parsers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
        let _ = chunked_end(&bytes);
        let _ = parse_head(&bytes);
    }

    #[test]
    fn any_chunking_of_a_body_is_found_whole(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 1..300), 0..20),
        tail in proptest::collection::vec(proptest::num::u8::ANY, 0..50),
    ) {
        let mut body = Vec::new();
        for c in &chunks {
            body.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            body.extend_from_slice(c);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"0\r\n\r\n");
        let end = body.len();
        proptest::prop_assert_eq!(chunked_end(&body[..end - 1]), Ok(None));
        body.extend_from_slice(&tail);
        proptest::prop_assert_eq!(chunked_end(&body), Ok(Some(end)));
    }
}

#[tokio::test]
async fn a_silent_address_does_not_hold_back_the_next_one() {
    let v6: SocketAddr = "[2001:db8::1]:443".parse().unwrap();
    let v4: SocketAddr = "192.0.2.1:443".parse().unwrap();
    let tried = Arc::new(Mutex::new(Vec::new()));
    let log = tried.clone();
    // The IPv6 address never answers; the IPv4 one connects.
    let connect = move |addr: SocketAddr| {
        log.lock().unwrap().push(addr);
        async move {
            if addr.is_ipv6() {
                std::future::pending::<()>().await;
            }
            Ok::<SocketAddr, std::io::Error>(addr)
        }
    };
    let got = tokio::time::timeout(Duration::from_secs(5), connect_any(&[v6, v4], connect))
        .await
        .expect("one silent address held the connection back");
    assert_eq!(got, Some(v4));
    assert_eq!(*tried.lock().unwrap(), vec![v6, v4]);
    // Families alternate, the first address's family first: with every
    // attempt refused, each next one starts at once, in that order, and
    // all failing is None.
    let (a, b, c) = (v6, v4, "[2001:db8::2]:443".parse().unwrap());
    let order = Arc::new(Mutex::new(Vec::new()));
    let refuse_noting = |addr: SocketAddr| {
        order.lock().unwrap().push(addr);
        async { Err::<(), _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) }
    };
    assert_eq!(connect_any(&[a, c, b], refuse_noting).await, None);
    assert_eq!(*order.lock().unwrap(), vec![a, b, c]);
}

#[tokio::test]
async fn a_request_the_receiver_drops_on_a_reused_connection_goes_out_again() {
    // The receiver reads the second request on the kept connection and
    // closes it without an answer (as when its idle timeout fires just
    // then): the request is sent again on a new connection.
    let (seen, connections, requests) = statuses(
        vec![
            "HTTP/1.1 204 No Content\r\n\r\n",
            "|close|",
            "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n",
        ],
        2,
        Duration::ZERO,
    )
    .await;
    assert_eq!(seen, [204, 202]);
    assert_eq!(requests, 3);
    assert_eq!(connections, 2);
}

#[tokio::test]
async fn bytes_left_on_an_idle_connection_are_not_taken_for_the_next_answer() {
    // After its answer the receiver writes a stray head on the idle
    // connection: reusing it would report 418 for the next request.
    let (seen, connections, _) = statuses(
        vec![
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n|pause|HTTP/1.1 418 Teapot\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n",
        ],
        2,
        // Twenty times the receiver's pause before its stray head.
        Duration::from_millis(1000),
    )
    .await;
    assert_eq!(seen, [200, 201]);
    assert_eq!(connections, 2);
}

#[tokio::test]
async fn an_answer_that_is_not_http_fails_the_request() {
    let (url, _, _) = receiver(vec!["SMTP ready\r\n\r\n"], 1024).await;
    assert_eq!(
        post(&client(), &url).await.unwrap_err(),
        Failure::Failed("request failed".into())
    );
}

#[tokio::test]
async fn a_refused_destination_is_told_apart_from_a_failed_request() {
    let (url, connections, _) =
        receiver(vec!["HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"], 1024).await;
    let strict =
        HttpClient::new(Duration::from_secs(5), Duration::from_secs(5), Vec::new()).unwrap();
    match post(&strict, &url).await {
        Err(Failure::Refused(e)) => assert!(e.contains("CONTROLPLANE_ALLOWED_TARGETS"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(matches!(
        post(&strict, "ftp://example.com/").await,
        Err(Failure::Refused(_))
    ));
    assert!(matches!(
        post(&client(), "http://no-such-host.invalid/").await,
        Err(Failure::Failed(e)) if e.contains("cannot resolve")
    ));
    assert_eq!(post(&client(), &url).await.unwrap().status, 200);
}

#[test]
fn control_characters_in_a_header_are_refused() {
    let t = Target::parse("http://example.com/").unwrap();
    let e = encode(&t, &[("webhook-id", "a\r\nx: y".into())], b"").unwrap_err();
    assert!(e.contains("webhook-id"), "{e}");
    let ok = encode(&t, &[("webhook-id", "msg_1".into())], b"{}").unwrap();
    let text = String::from_utf8(ok).unwrap();
    assert!(
        text.starts_with("POST / HTTP/1.1\r\nhost: example.com\r\n"),
        "{text}"
    );
    assert!(
        text.ends_with("content-length: 2\r\nwebhook-id: msg_1\r\n\r\n{}"),
        "{text}"
    );
}
