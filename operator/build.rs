// See scripts/git-rev.rs: sets FERRY_GIT_REV for `--version`.
include!("../scripts/git-rev.rs");
