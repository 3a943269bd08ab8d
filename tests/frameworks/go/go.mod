module spindle.test/frameworks

go 1.19
