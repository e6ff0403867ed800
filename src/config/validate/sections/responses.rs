//! `responses`: what every answer carries, and the refusals in place of
//! sluice's own.

use crate::config::keys;
use crate::config::locate::KeyPath;
use crate::config::raw::{self};
use crate::config::validate::check::{self, Checker};
use crate::config::Responses;

pub fn responses(cx: &mut Checker<'_>, path: &KeyPath, raw: raw::Responses) -> Option<Responses> {
    let on_allowed = cx.defaulted(
        path,
        &keys::RESPONSES_RATELIMIT_HEADERS_ON_ALLOWED,
        raw.ratelimit_headers_on_allowed.as_ref(),
        check::boolean,
    )?;
    let answers = super::answers(cx, path, raw.refused, raw.unavailable);
    Some(Responses {
        ratelimit_headers_on_allowed: on_allowed,
        answers: answers?,
    })
}
