module github.com/sluice-rs/sluice/clients/go

go 1.19
