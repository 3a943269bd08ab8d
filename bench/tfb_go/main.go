// The benchmark peer for examples/tfb: the TechEmpower test types written the way the fast Go
// entries are (fasthttp + pgx with a connection pool, prepared statements, one UPDATE per
// request built with CASE, cached per count). Built by bench/db_compare.py.
//
//	tfb_go -listen 127.0.0.1:8080 -db "host=/run/postgresql dbname=x" -connections 8
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"log"
	"math/rand"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/valyala/fasthttp"
)

type World struct {
	ID           int32 `json:"id"`
	RandomNumber int32 `json:"randomNumber"`
}

type Fortune struct {
	ID      int32
	Message string
}

const worldSelect = "SELECT id, randomnumber FROM world WHERE id = $1"
const fortuneSelect = "SELECT id, message FROM fortune"

var (
	db         *pgxpool.Pool
	updateSQL  [501]string
	serverName = []byte("tfb_go")
)

func randomID() int32 { return int32(rand.Intn(10000) + 1) }

func count(ctx *fasthttp.RequestCtx, name string) int {
	n, err := strconv.Atoi(string(ctx.QueryArgs().Peek(name)))
	if err != nil || n < 1 {
		return 1
	}
	if n > 500 {
		return 500
	}
	return n
}

func buildUpdates() {
	for n := 1; n <= 500; n++ {
		var b strings.Builder
		b.WriteString("UPDATE world SET randomnumber = CASE id")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, " WHEN $%d::int4 THEN $%d::int4", 2*i+1, 2*i+2)
		}
		b.WriteString(" ELSE randomnumber END WHERE id IN (")
		for i := 0; i < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "$%d::int4", 2*i+1)
		}
		b.WriteByte(')')
		updateSQL[n] = b.String()
	}
}

func worlds(n int) ([]World, error) {
	// One statement per row, one after the other, as the fasthttp entry does (pgx's batch
	// would coalesce Syncs, which TechEmpower's rules forbid).
	out := make([]World, n)
	for i := 0; i < n; i++ {
		if err := db.QueryRow(context.Background(), worldSelect, randomID()).Scan(&out[i].ID, &out[i].RandomNumber); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func writeJSON(ctx *fasthttp.RequestCtx, v any) {
	ctx.Response.Header.SetServerBytes(serverName)
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(v)
	ctx.SetBody(b)
}

func handler(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/plaintext":
		ctx.Response.Header.SetServerBytes(serverName)
		ctx.SetContentType("text/plain")
		ctx.SetBodyString("Hello, World!")
	case "/json":
		writeJSON(ctx, map[string]string{"message": "Hello, World!"})
	case "/db":
		var w World
		if err := db.QueryRow(context.Background(), worldSelect, randomID()).Scan(&w.ID, &w.RandomNumber); err != nil {
			ctx.Error(err.Error(), 500)
			return
		}
		writeJSON(ctx, w)
	case "/queries":
		ws, err := worlds(count(ctx, "queries"))
		if err != nil {
			ctx.Error(err.Error(), 500)
			return
		}
		writeJSON(ctx, ws)
	case "/updates":
		ws, err := worlds(count(ctx, "queries"))
		if err != nil {
			ctx.Error(err.Error(), 500)
			return
		}
		byID := map[int32]int32{}
		for i := range ws {
			if v, ok := byID[ws[i].ID]; ok {
				ws[i].RandomNumber = v
				continue
			}
			ws[i].RandomNumber = randomID()
			byID[ws[i].ID] = ws[i].RandomNumber
		}
		ids := make([]int32, 0, len(byID))
		for id := range byID {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
		args := make([]any, 0, 2*len(ids))
		for _, id := range ids {
			args = append(args, id, byID[id])
		}
		if _, err := db.Exec(context.Background(), updateSQL[len(ids)], args...); err != nil {
			ctx.Error(err.Error(), 500)
			return
		}
		writeJSON(ctx, ws)
	case "/fortunes":
		rows, err := db.Query(context.Background(), fortuneSelect)
		if err != nil {
			ctx.Error(err.Error(), 500)
			return
		}
		fortunes := []Fortune{{0, "Additional fortune added at request time."}}
		for rows.Next() {
			var f Fortune
			if err := rows.Scan(&f.ID, &f.Message); err != nil {
				ctx.Error(err.Error(), 500)
				return
			}
			fortunes = append(fortunes, f)
		}
		rows.Close()
		sort.Slice(fortunes, func(a, b int) bool { return fortunes[a].Message < fortunes[b].Message })
		var b strings.Builder
		b.WriteString("<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table><tr><th>id</th><th>message</th></tr>")
		for _, f := range fortunes {
			b.WriteString("<tr><td>")
			b.WriteString(strconv.Itoa(int(f.ID)))
			b.WriteString("</td><td>")
			b.WriteString(html.EscapeString(f.Message))
			b.WriteString("</td></tr>")
		}
		b.WriteString("</table></body></html>")
		ctx.Response.Header.SetServerBytes(serverName)
		ctx.SetContentType("text/html; charset=utf-8")
		ctx.SetBodyString(b.String())
	default:
		ctx.Error("not found", 404)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address")
	conninfo := flag.String("db", "", "PostgreSQL connection string")
	connections := flag.Int("connections", 4, "pool size")
	threads := flag.Int("threads", 0, "GOMAXPROCS (0: all cores)")
	flag.Parse()
	if *threads > 0 {
		runtime.GOMAXPROCS(*threads)
	}
	config, err := pgxpool.ParseConfig(*conninfo)
	if err != nil {
		log.Fatal(err)
	}
	config.MaxConns = int32(*connections)
	config.MinConns = int32(*connections)
	config.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	db, err = pgxpool.NewWithConfig(context.Background(), config)
	if err != nil {
		log.Fatal(err)
	}
	buildUpdates()
	fmt.Printf("{\"event\":\"listening\",\"address\":%q}\n", *listen)
	server := &fasthttp.Server{Handler: handler, Name: "tfb_go"}
	log.Fatal(server.ListenAndServe(*listen))
}
