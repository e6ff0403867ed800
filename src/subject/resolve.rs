pub struct Resolved;
pub fn resolve() {}
