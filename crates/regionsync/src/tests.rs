use super::*;

#[test]
fn bad_region_settings_name_their_field() {
    let field = |c: RegionConfig| match check_config(&c) {
        Err(StartError::Config { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    let good = RegionConfig::new("us", "eu", "http://eu:8083", "0123456789abcdef");
    assert!(check_config(&good).is_ok());
    assert_eq!(
        field(RegionConfig::new(
            "US",
            "eu",
            "http://eu",
            "0123456789abcdef"
        )),
        "region"
    );
    assert_eq!(
        field(RegionConfig::new(
            "us",
            "us",
            "http://eu",
            "0123456789abcdef"
        )),
        "peer_region"
    );
    assert_eq!(
        field(RegionConfig::new("us", "eu", "http://eu", "short")),
        "region_secret"
    );
    let mut share = good.clone();
    share.default_share = 0.0;
    assert_eq!(field(share), "region_share");
}
