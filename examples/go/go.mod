module example.com/sluice-check

go 1.19

require github.com/sluice-rs/sluice/clients/go v0.1.0

// From a checkout of the repository; drop this line to use the published module.
replace github.com/sluice-rs/sluice/clients/go => ../../clients/go
