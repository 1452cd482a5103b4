mod support;
#[test]
fn compiles() {}
