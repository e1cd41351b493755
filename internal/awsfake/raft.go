package awsfake

// SetPageSize sets the most items the fake returns in one page of any list
// (7 by default, so that tests must follow NextToken). Real EC2 returns up
// to MaxResults (at most 1000) instances a page; a test that counts calls
// as AWS would bill them sets that.
func (f *Server) SetPageSize(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pageSize = n
}
