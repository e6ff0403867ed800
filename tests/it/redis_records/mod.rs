//! De-duplication records against a real `redis-server`: a call whose
//! reply is lost is retried once and charged once, alone and in a batch
//! (`retries`); a first send reads no record and leaves one only when it
//! admits, claimed before it charges, so one its own retry overtook
//! replays it, every record expires with the window, and state and
//! records are stored as `lua/README.md` lays them out (`kept`, the
//! policy's function called as Redis sees it); and end to end, through
//! the binary: only admissions leave records, and a refund finds them
//! (`end_to_end`).

mod end_to_end;
mod kept;
mod retries;
