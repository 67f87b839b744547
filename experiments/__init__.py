"""Study declarations (each file defines STUDY); run them with `k3scale study run FILE`."""
