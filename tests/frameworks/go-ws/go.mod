module spindle.test/gows

go 1.24
