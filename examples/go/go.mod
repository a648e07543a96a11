module example.com/sluice-check

go 1.19
