use super::*;

#[tokio::test]
async fn an_idle_bucket_task_is_small() {
    let node = tollgate_node::NodeBuilder::new()
        .rules_text("domain: d\nrules: []\n")
        .start()
        .await
        .expect("a node");
    let broker = Broker::new(node, RlqsConfig::default());
    let bucket = Arc::new(SharedBucket {
        key: Arc::new(BucketKey {
            domain: "d".into(),
            entries: vec![("k".into(), "v".into())],
        }),
        state: Mutex::new(BucketState::default()),
        wake: Notify::new(),
    });
    let task = run(broker.inner.clone(), bucket);
    let size = std::mem::size_of_val(&task);
    assert!(size <= 1024, "a bucket's task holds {size} bytes");
    eprintln!("a bucket task: {size} bytes");
}
