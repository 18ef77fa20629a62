package gateway_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/broadcastd/broadcast/internal/gateway"
)

// A test points a webhook account at the gateway, sends, then reads the
// ledger to see what the provider really received.
func Example() {
	g, err := gateway.New(gateway.Config{Secret: "s3cr3t", PermanentPrefix: "invalid:"})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(g)
	defer srv.Close()

	send := func(id, to string) int {
		body := []byte(fmt.Sprintf(`{"id":%q,"task_id":"t1","to":%q,"body":"Hi","account":"shop","attempt":1}`, id, to))
		mac := hmac.New(sha256.New, []byte("s3cr3t"))
		mac.Write(body)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/send", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", id)
		req.Header.Set("X-Broadcast-Signature", "sha256="+hex.EncodeToString(mac.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	fmt.Println(send("t1:alice", "+4915100001"))
	fmt.Println(send("t1:alice", "+4915100001")) // a retry after a lost answer
	fmt.Println(send("t1:bob", "invalid:42"))

	l := g.Ledger()
	fmt.Printf("requests=%d accepted=%d keys=%d duplicates=%d permanent=%d\n",
		l.Requests, l.Accepted, l.AcceptedKeys(), l.Duplicates, l.Injected["400"])
	// Output:
	// 200
	// 200
	// 400
	// requests=3 accepted=2 keys=1 duplicates=1 permanent=1
}
