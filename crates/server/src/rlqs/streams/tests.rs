use super::*;
use futures::StreamExt;
use tollgate_proto::envoy::service::rate_limit_quota::v3::BucketId;
use tollgate_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, QuotaAssignmentAction,
};

#[test]
fn places_are_bounded_per_host_and_over_the_node() {
    let places = Arc::new(Places::default());
    let a: IpAddr = "10.0.0.1".parse().expect("ip");
    let b: IpAddr = "10.0.0.2".parse().expect("ip");
    let held: Vec<Place> = (0..2)
        .map(|_| places.take(a, 3, 2).expect("a place"))
        .collect();
    assert_eq!(places.take(a, 3, 2).err(), Some(Refusal::HostFull));
    let third = places.take(b, 3, 2).expect("another host");
    assert_eq!(places.take(b, 3, 2).err(), Some(Refusal::Full));
    drop(held);
    assert_eq!(places.open(), 1);
    assert!(places.take(a, 3, 2).is_ok());
    drop(third);
}

fn key(name: &str) -> Arc<BucketKey> {
    let id = BucketId {
        bucket: [("name".to_owned(), name.as_bytes().to_vec())].into(),
    };
    Arc::new(BucketKey::of("d", &id).expect("a key"))
}

/// An action that says which it was.
fn action(name: &str, ttl: i64) -> BucketAction {
    BucketAction {
        bucket_id: Some(BucketId {
            bucket: [("name".to_owned(), name.as_bytes().to_vec())].into(),
        }),
        bucket_action: Some(Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(prost_types::Duration {
                seconds: ttl,
                nanos: 0,
            }),
            rate_limit_strategy: None,
        })),
    }
}

fn ttl_of(action: &BucketAction) -> i64 {
    match &action.bucket_action {
        Some(Kind::QuotaAssignmentAction(a)) => {
            a.assignment_time_to_live.as_ref().map_or(0, |d| d.seconds)
        }
        _ => 0,
    }
}

fn budget() -> Arc<Budget> {
    Arc::new(Budget::new(Default::default()))
}

#[tokio::test]
async fn an_end_goes_out_before_what_waits_and_nothing_after() {
    let outbox = Outbox::new(budget());
    let stream = StreamHandle::new(1, "10.0.0.1".parse().expect("ip"), outbox.clone());
    let (mut answers, end) = Answers::new(outbox.clone());
    assert!(stream.send(&key("a"), action("a", 1)));
    end.send(Status::resource_exhausted("too large"))
        .expect("end");
    let first = answers.next().await.expect("an item");
    assert_eq!(
        first.expect_err("the end first").code(),
        tonic::Code::ResourceExhausted
    );
    assert!(answers.next().await.is_none());
    assert!(!stream.send(&key("b"), action("b", 1)), "nothing after");
    // Dropping the way to end it ends it too, with an answer still waiting.
    let outbox = Outbox::new(budget());
    let stream = StreamHandle::new(2, "10.0.0.1".parse().expect("ip"), outbox.clone());
    let (mut answers, end) = Answers::new(outbox.clone());
    assert!(stream.send(&key("a"), action("a", 1)));
    drop(end);
    assert!(answers.next().await.is_none());
    // The answers dropped (tonic is done with the stream), the stream learns it.
    let outbox = Outbox::new(budget());
    let (answers, _end) = Answers::new(outbox.clone());
    drop(answers);
    tokio::time::timeout(Duration::from_secs(1), outbox.closed())
        .await
        .expect("closed");
}

#[tokio::test]
async fn one_word_for_each_bucket_goes_out_in_bounded_answers_and_none_is_lost() {
    let outbox = Outbox::new(budget());
    let stream = StreamHandle::new(1, "10.0.0.1".parse().expect("ip"), outbox.clone());
    let (mut answers, _end) = Answers::new(outbox.clone());
    // More than any fixed queue would hold, and one bucket told twice before it was sent.
    for i in 0..2_500 {
        let name = format!("k{i}");
        assert!(stream.send(&key(&name), action(&name, 1)));
    }
    // An assignment does not replace one still waiting (its tokens were paid for).
    assert!(!stream.send(&key("k7"), action("k7", 2)));
    assert_eq!(outbox.waiting(), 2_500);
    let mut sizes = vec![];
    let mut seen = HashMap::new();
    while outbox.waiting() > 0 {
        let answer = answers.next().await.expect("an answer").expect("ok");
        sizes.push(answer.bucket_action.len());
        for a in answer.bucket_action {
            let name = String::from_utf8(a.bucket_id.as_ref().expect("id").bucket["name"].clone())
                .expect("utf-8");
            assert!(seen.insert(name, ttl_of(&a)).is_none(), "sent once");
        }
    }
    assert_eq!(sizes, vec![1_000, 1_000, 500]);
    assert_eq!(seen.len(), 2_500);
    assert_eq!(seen["k7"], 1, "the first assignment stands");
    // An abandon replaces an assignment not yet sent: the bucket is gone.
    assert!(stream.send(&key("z"), action("z", 1)));
    let abandon = BucketAction {
        bucket_id: action("z", 1).bucket_id,
        bucket_action: Some(Kind::AbandonAction(AbandonAction {})),
    };
    assert!(stream.send(&key("z"), abandon));
    let answer = answers.next().await.expect("an answer").expect("ok");
    assert_eq!(answer.bucket_action.len(), 1);
    assert!(matches!(
        answer.bucket_action[0].bucket_action,
        Some(Kind::AbandonAction(_))
    ));
    // Long ids: an answer is bounded in bytes as well.
    let long = "x".repeat(3_000);
    for i in 0..200 {
        let name = format!("{i}{long}");
        assert!(stream.send(&key(&name), action(&name, 1)));
    }
    let answer = answers.next().await.expect("an answer").expect("ok");
    assert!(
        answer.bucket_action.len() < 100,
        "{}",
        answer.bucket_action.len()
    );
}

#[tokio::test]
async fn what_waits_unsent_starts_the_unread_clock_and_an_answer_stops_it() {
    let outbox = Outbox::new(budget());
    let stream = StreamHandle::new(1, "10.0.0.1".parse().expect("ip"), outbox.clone());
    let (mut answers, _end) = Answers::new(outbox.clone());
    assert_eq!(stream.unread_for(Instant::now()), None);
    assert!(stream.send(&key("a"), action("a", 1)));
    assert!(stream.unread_for(Instant::now()).is_some());
    answers.next().await.expect("an answer").expect("ok");
    assert_eq!(stream.unread_for(Instant::now()), None);
}

#[tokio::test]
async fn an_answer_no_share_pays_for_is_paid_from_the_budget_while_it_waits() {
    let budget = budget();
    let outbox = Outbox::new(budget.clone());
    let stream = StreamHandle::new(1, "10.0.0.1".parse().expect("ip"), outbox.clone());
    let (mut answers, _end) = Answers::new(outbox.clone());
    let (a, b) = (key("a"), key("b"));
    let most = WAITING_BYTES + a.bytes();
    assert!(stream.send_unpaid(&a, action("a", 1), most));
    assert_eq!(budget.held(), most);
    assert!(!stream.send_unpaid(&b, action("b", 1), most), "no room");
    answers.next().await.expect("an answer").expect("ok");
    assert_eq!(budget.held(), 0, "paid back once sent");
    assert!(stream.send_unpaid(&b, action("b", 1), most));
    drop(answers);
    assert_eq!(budget.held(), 0, "paid back when the stream is gone");
    assert!(!stream.send_unpaid(&a, action("a", 1), most));
    assert_eq!(budget.held(), 0);
}
