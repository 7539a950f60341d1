//! A CopySchedule's `schedule` and `timeZone` as times: parsing (5 fields or a macro; a
//! refusal names the field and says what to write instead), the most recent scheduled time
//! at or before a moment, the next one after it, and the nominal interval between runs.
//! Pure: callers pass the clock in, so the controller's decisions are tested on a fake one.
//!
//! The cron dialect and the daylight-saving rules are croner's (Vixie cron's, as the Open
//! Cron Pattern Specification writes them down): a fixed time that a spring-forward gap
//! skips runs at the first minute after the gap, the same day; a fixed time that a
//! fall-back repeats runs once, the first time; `*` and step fields in the hour or minute
//! run on the wall clock as it goes. (Kubernetes' CronJob, on robfig/cron, skips the first
//! and runs the second twice.) Zones come from the IANA database compiled into the
//! operator (jiff's bundled copy), never from the machine's `/usr/share/zoneinfo`.

use std::time::Duration;

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::Timestamp;

use ferry_crds::Reason;
use ferry_resolve::validate::Refusal;

/// Runs looked at to find the nominal interval: enough to span a weekend for a weekday
/// schedule and February for a monthly one.
const INTERVAL_RUNS: usize = 10;

/// A cron expression read in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    zone: TimeZone,
}

fn invalid(message: String) -> Refusal {
    Refusal {
        reason: Reason::InvalidSpec,
        message,
    }
}

const FIELDS: &str = "write 5 fields, minute hour day-of-month month day-of-week (e.g. \"30 2 * * *\" for 02:30 every day, \"*/15 * * * *\" for every 15 minutes), or one of @hourly, @daily, @weekly, @monthly, @yearly";

impl Schedule {
    /// `expression` (spec.schedule) in `zone` (spec.timeZone, an IANA name), or why not, as
    /// an `InvalidSpec` refusal whose message names the field and the fix.
    pub fn new(expression: &str, zone: &str) -> Result<Self, Refusal> {
        let zone = TimeZone::get(zone).map_err(|_| {
            invalid(format!(
                "spec.timeZone {zone:?} is not a time zone of the IANA database; name one such as \"Europe/Berlin\", \"America/New_York\" or \"UTC\" (the default)"
            ))
        })?;
        let trimmed = expression.trim();
        // CronJob refuses these too: the zone has its own field, which is validated.
        if let Some(tz) = ["CRON_TZ=", "TZ="]
            .iter()
            .find_map(|p| trimmed.strip_prefix(p))
        {
            let name = tz.split_whitespace().next().unwrap_or_default();
            return Err(invalid(format!(
                "spec.schedule {expression:?} names a time zone: set spec.timeZone: {name} and leave only the 5 fields in spec.schedule"
            )));
        }
        // robfig/cron's (CronJob's) name for @daily, which croner does not know.
        let trimmed = if trimmed.eq_ignore_ascii_case("@midnight") {
            "@daily"
        } else {
            trimmed
        };
        let fields = trimmed.split_whitespace().count();
        if !trimmed.starts_with('@') && fields != 5 {
            return Err(invalid(format!(
                "spec.schedule {expression:?} has {fields} fields: {FIELDS}"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(trimmed)
            .map_err(|e| {
                invalid(format!(
                    "spec.schedule {expression:?} is not a cron expression ({e}): {FIELDS}"
                ))
            })?;
        let schedule = Self { cron, zone };
        // A day that does not exist ("0 0 30 2 *") parses but never comes.
        if schedule.next_after(Timestamp::now()).is_none() {
            return Err(invalid(format!(
                "spec.schedule {expression:?} never comes due (no date matches it); check the day-of-month and month fields"
            )));
        }
        Ok(schedule)
    }

    /// The most recent scheduled time at or before `now`.
    pub fn most_recent(&self, now: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_previous_occurrence(&now.to_zoned(self.zone.clone()), true)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The first scheduled time after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_next_occurrence(&t.to_zoned(self.zone.clone()), false)
            .ok()
            .map(|z| z.timestamp())
    }

    /// The nominal time between two runs: the longest gap between consecutive runs among
    /// the next few after `from` (a weekday schedule's is the weekend's, 3 days; a monthly
    /// one's 31 days), so "late by three intervals" never fires on a schedule that runs on
    /// time.
    pub fn interval(&self, from: Timestamp) -> Option<Duration> {
        let runs: Vec<Timestamp> = self
            .cron
            .iter_after(from.to_zoned(self.zone.clone()))
            .take(INTERVAL_RUNS)
            .map(|z| z.timestamp())
            .collect();
        runs.windows(2)
            .filter_map(|w| w[1].duration_since(w[0]).try_into().ok())
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("an RFC 3339 time")
    }

    fn schedule(expression: &str, zone: &str) -> Schedule {
        Schedule::new(expression, zone).expect("a valid schedule")
    }

    #[test]
    fn every_minute_runs_at_each_minute_and_not_between() {
        let s = schedule("* * * * *", "UTC");
        assert_eq!(
            s.most_recent(at("2026-05-04T10:17:42Z")),
            Some(at("2026-05-04T10:17:00Z"))
        );
        // A scheduled time is its own most recent one.
        assert_eq!(
            s.most_recent(at("2026-05-04T10:17:00Z")),
            Some(at("2026-05-04T10:17:00Z"))
        );
        assert_eq!(
            s.next_after(at("2026-05-04T10:17:00Z")),
            Some(at("2026-05-04T10:18:00Z"))
        );
        assert_eq!(
            s.interval(at("2026-05-04T10:17:42Z")),
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn hourly_and_its_macro_run_on_the_hour() {
        for e in ["0 * * * *", "@hourly", "@HOURLY"] {
            let s = schedule(e, "UTC");
            assert_eq!(
                s.most_recent(at("2026-05-04T10:59:59Z")),
                Some(at("2026-05-04T10:00:00Z")),
                "{e}"
            );
            assert_eq!(
                s.next_after(at("2026-05-04T10:00:00Z")),
                Some(at("2026-05-04T11:00:00Z")),
                "{e}"
            );
            assert_eq!(
                s.interval(at("2026-05-04T10:00:00Z")),
                Some(Duration::from_secs(3600))
            );
        }
        let daily = schedule("@midnight", "UTC");
        assert_eq!(
            daily.next_after(at("2026-05-04T10:00:00Z")),
            Some(at("2026-05-05T00:00:00Z"))
        );
    }

    #[test]
    fn a_weekday_schedule_has_the_weekend_as_its_interval() {
        let s = schedule("0 9 * * MON-FRI", "UTC");
        assert_eq!(
            s.interval(at("2026-05-04T10:00:00Z")),
            Some(Duration::from_secs(3 * 24 * 3600))
        );
    }

    #[test]
    fn a_time_zone_moves_the_runs_and_spring_forward_runs_a_skipped_time_after_the_gap() {
        // Europe/Berlin springs forward on 2026-03-29 at 02:00 CET to 03:00 CEST: 02:30
        // does not exist that day. The run comes at 03:00 CEST (01:00 UTC), once.
        let s = schedule("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            s.next_after(at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-29T01:00:00Z"))
        );
        assert_eq!(
            s.most_recent(at("2026-03-29T12:00:00Z")),
            Some(at("2026-03-29T01:00:00Z"))
        );
        // The day before (CET, UTC+1) and after (CEST, UTC+2): 02:30 local.
        assert_eq!(
            s.most_recent(at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-28T01:30:00Z"))
        );
        assert_eq!(
            s.next_after(at("2026-03-29T01:00:00Z")),
            Some(at("2026-03-30T00:30:00Z"))
        );
        // Fall back (2026-10-25, 03:00 CEST to 02:00 CET): 02:30 happens twice; it runs once.
        let autumn: Vec<Timestamp> = [at("2026-10-24T12:00:00Z")]
            .into_iter()
            .chain(std::iter::successors(
                s.next_after(at("2026-10-24T12:00:00Z")),
                |t| s.next_after(*t),
            ))
            .skip(1)
            .take(2)
            .collect();
        assert_eq!(
            autumn,
            [at("2026-10-25T00:30:00Z"), at("2026-10-26T01:30:00Z")]
        );
        // The same expression in UTC.
        assert_eq!(
            schedule("30 2 * * *", "UTC").next_after(at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-29T02:30:00Z"))
        );
    }

    #[test]
    fn bad_expressions_and_zones_are_refused_naming_the_field_and_the_fix() {
        for (expression, zone, says) in [
            (
                "61 * * * *",
                "UTC",
                "spec.schedule \"61 * * * *\" is not a cron expression",
            ),
            ("* * * *", "UTC", "has 4 fields: write 5 fields"),
            ("0 * * * * *", "UTC", "has 6 fields"),
            ("every day", "UTC", "has 2 fields"),
            ("@fortnightly", "UTC", "is not a cron expression"),
            ("", "UTC", "has 0 fields"),
            ("0 0 30 2 *", "UTC", "never comes due"),
            (
                "TZ=Europe/Berlin 0 3 * * *",
                "UTC",
                "set spec.timeZone: Europe/Berlin",
            ),
            (
                "0 3 * * *",
                "Mars/Olympus_Mons",
                "spec.timeZone \"Mars/Olympus_Mons\" is not a time zone",
            ),
            ("0 3 * * *", "Local", "(the default)"),
            ("0 3 * * *", "", "spec.timeZone \"\" is not a time zone"),
        ] {
            let refused = Schedule::new(expression, zone).expect_err(expression);
            assert_eq!(refused.reason, Reason::InvalidSpec);
            assert!(
                refused.message.contains(says),
                "{expression:?} {zone:?}: {}",
                refused.message
            );
        }
        // Names croner takes, and a zone by its IANA name.
        for (expression, zone) in [
            ("0 3 * * SUN", "UTC"),
            ("0 3 1 JAN *", "UTC"),
            ("0 3 L * *", "UTC"),
            ("0 3 * * 5#2", "UTC"),
            ("*/5 1-3 * * 1,3,5", "America/New_York"),
            ("0 0 * * 7", "UTC"),
        ] {
            assert!(
                Schedule::new(expression, zone).is_ok(),
                "{expression} {zone:?}: {:?}",
                Schedule::new(expression, zone).err()
            );
        }
    }
}
