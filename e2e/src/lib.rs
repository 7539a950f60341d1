//! End-to-end harness (etcd + kube-apiserver + operator + agents). Filled by the control-plane issue.
