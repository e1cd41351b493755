package awsfake

import (
	"encoding/xml"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

func init() {
	register("DescribeInstances", true, (*Server).describeInstances)
}

type ec2InstanceXML struct {
	InstanceID       string `xml:"instanceId"`
	ImageID          string `xml:"imageId"`
	StateCode        int    `xml:"instanceState>code"`
	StateName        string `xml:"instanceState>name"`
	PrivateIPAddress string `xml:"privateIpAddress,omitempty"`
	InstanceType     string `xml:"instanceType"`
	LaunchTime       string `xml:"launchTime,omitempty"`
}

type ec2ReservationXML struct {
	ReservationID string           `xml:"reservationId"`
	OwnerID       string           `xml:"ownerId"`
	Instances     []ec2InstanceXML `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName      xml.Name            `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstancesResponse"`
	RequestID    string              `xml:"requestId"`
	Reservations []ec2ReservationXML `xml:"reservationSet>item"`
	NextToken    string              `xml:"nextToken,omitempty"`
}

var ec2StateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func (f *Server) describeInstances(w http.ResponseWriter, r *http.Request) {
	ids := listParam(r, "InstanceId")
	var ips []string // a private-ip-address filter's values
	for i := 1; ; i++ {
		p := "Filter." + strconv.Itoa(i)
		name, ok := r.Form[p+".Name"]
		if !ok {
			break
		}
		switch name[0] {
		case "instance-id":
			ids = append(ids, listParam(r, p+".Value")...)
		case "private-ip-address":
			ips = append(ips, listParam(r, p+".Value")...)
		default:
			f.problem("DescribeInstances filter %q: the fake knows only instance-id and private-ip-address", name[0])
		}
	}
	if len(ips) > 0 {
		if len(ids) > 0 {
			f.problem("DescribeInstances with both instance IDs and private-ip-address: the fake does not combine them")
		}
		// EC2 matches an IP against the instances that hold it now: a
		// terminated instance has none.
		for _, id := range f.order {
			if in := f.instances[id]; in.PrivateIP != "" && slices.Contains(ips, in.PrivateIP) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			writeXML(w, describeInstancesResponse{RequestID: "req-ec2"})
			return
		}
	} else if r.Form.Get("NextToken") == "" {
		f.batches = append(f.batches, len(ids))
	}
	if len(ids) == 0 {
		// Real EC2 would describe every instance in the region.
		f.problem("DescribeInstances without instance IDs")
		writeEC2Error(w, http.StatusBadRequest, "InvalidParameterCombination", "the fake refuses unbounded DescribeInstances")
		return
	}
	if len(r.Form["InstanceId.1"]) > 0 && r.Form.Get("MaxResults") != "" {
		writeEC2Error(w, http.StatusBadRequest, "InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
		return
	}
	pageSize := f.pageSize
	if m := r.Form.Get("MaxResults"); m != "" {
		n, err := strconv.Atoi(m)
		if err != nil || n < 5 || n > 1000 {
			writeEC2Error(w, http.StatusBadRequest, "InvalidParameterValue", "MaxResults must be 5-1000")
			return
		}
		pageSize = min(pageSize, n)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var matches []*Instance
	for _, id := range f.order {
		if want[id] {
			matches = append(matches, f.instances[id])
		}
	}
	from, to, next, ok := page(len(matches), pageSize, r.Form.Get("NextToken"))
	if !ok {
		writeEC2Error(w, http.StatusBadRequest, "InvalidPaginationToken", "The token is invalid.")
		return
	}
	// One reservation per instance, as for instances launched one by one.
	var res []ec2ReservationXML
	for _, in := range matches[from:to] {
		res = append(res, ec2ReservationXML{
			ReservationID: "r-" + strings.TrimPrefix(in.ID, "i-"),
			OwnerID:       "123456789012",
			Instances: []ec2InstanceXML{{
				InstanceID: in.ID, ImageID: "ami-12345678", InstanceType: "t3.micro",
				StateCode: ec2StateCodes[in.State], StateName: in.State, PrivateIPAddress: in.PrivateIP,
				LaunchTime: in.LaunchTime.Format(time.RFC3339),
			}},
		})
	}
	writeXML(w, describeInstancesResponse{RequestID: "req-ec2", Reservations: res, NextToken: next})
}

type ec2ErrorResponse struct {
	XMLName   xml.Name `xml:"Response"`
	Code      string   `xml:"Errors>Error>Code"`
	Message   string   `xml:"Errors>Error>Message"`
	RequestID string   `xml:"RequestID"`
}

func writeEC2Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	xml.NewEncoder(w).Encode(ec2ErrorResponse{Code: code, Message: msg, RequestID: "req-err"})
}
