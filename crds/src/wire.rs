//! `wire_enum!`: an enum of unit variants whose names are what goes over the wire (status,
//! conditions, metric labels), with `ALL`, `as_str` and `Display` derived from the one
//! declaration, so no list of names is written twice.

macro_rules! wire_enum {
    ($(#[$m:meta])* pub enum $t:ident { $($(#[$doc:meta])* $v:ident),+ $(,)? }) => {
        $(#[$m])*
        #[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "k8s", derive(schemars::JsonSchema))]
        pub enum $t {
            $($(#[$doc])* $v),+
        }
        impl $t {
            /// Every value, in declaration order.
            pub const ALL: &'static [$t] = &[$($t::$v),+];
            /// The name on the wire.
            pub fn as_str(self) -> &'static str {
                match self { $($t::$v => stringify!($v)),+ }
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
